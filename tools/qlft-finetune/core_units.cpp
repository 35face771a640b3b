// Two plain-POSIX units of the core that the CLI compiles in as well (it links only libqlft.so,
// whose C++ symbols are hidden): the output rule, so `export` and `report` refuse before the
// model loads with the library's own rule, and the temporaries' marker, so the run directory's
// cleanup removes exactly what the writers mark. One source each, two builds.
#include "../../src/formats/output_guard.cpp"
#include "../../src/formats/temp_marker.cpp"
