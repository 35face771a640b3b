package qlft

import "fmt"

// Error is a failed qlft call: the C status code (QLFT_ERR_*) and the library's message.
// errors.Is(err, qlft.ErrIO) matches by code; a cancelled Train also unwraps to the context's
// error (context.Canceled or context.DeadlineExceeded) when the context caused it.
type Error struct {
	Code    int
	Message string
	cause   error
}

// Sentinels for errors.Is, one per status code.
var (
	ErrInvalidArgument = &Error{Code: 1}
	ErrIO              = &Error{Code: 2}
	ErrFormat          = &Error{Code: 3}
	ErrUnsupported     = &Error{Code: 4}
	ErrOutOfMemory     = &Error{Code: 5}
	ErrNumerical       = &Error{Code: 6}
	ErrCancelled       = &Error{Code: 7}
	ErrBackend         = &Error{Code: 8}
	ErrDistributed     = &Error{Code: 9}
	ErrInternal        = &Error{Code: 10}
)

func (e *Error) Error() string {
	if e.Message == "" {
		return StatusString(e.Code)
	}
	return fmt.Sprintf("%s: %s", StatusString(e.Code), e.Message)
}

// Is reports whether target is an *Error with the same code (sentinels carry no message).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Unwrap gives the context error behind a cancelled Train, if any.
func (e *Error) Unwrap() error { return e.cause }
