#include "config/keys.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/enum_names.h"
#include "core/error.h"
#include "core/memory.h"

namespace qlft {

namespace {
constexpr double kNoMin = -1e300, kNoMax = 1e300;

// Grouped by the prefix before the dot; keep each group together and sorted by meaning.
const KeyDef kKeys[] = {
    {"backend", KeyType::Enum, "cpu", 0, 0, "cpu|cuda",
     "Compute backend. cuda needs a build with QLFT_CUDA=ON and a device."},
    {"cuda.tf32", KeyType::Bool, "false", 0, 0, "",
     "backend=cuda, fp32 GEMMs (train.precision=fp32): let cuBLASLt use TF32 tensor cores (inputs "
     "rounded to a 10-bit mantissa, fp32 accumulation; PyTorch's allow_tf32). Several times "
     "faster on Ampere and later; results differ from fp32 by about 1e-3 relative."},
    {"cuda.graphs", KeyType::Bool, "false", 0, 0, "",
     "backend=cuda: submit the device work between two host waits as one CUDA graph (stream "
     "capture) instead of kernel by kernel: a few launches per training step instead of "
     "hundreds, the same results bit for bit. Off until measured on a device."},
    {"threads", KeyType::Int, "0", 0, 4096, "",
     "Worker threads for kernels and BLAS; 0 uses every core the process may run on."},
    {"memory.limit", KeyType::Size, "0", 0, 0, "",
     "Budget for runtime-owned memory (host RAM on cpu, device memory on cuda); 0 = unlimited. "
     "Accepts K, M, G, T suffixes (powers of 1024)."},
    {"log.level", KeyType::Enum, "warn", 0, 0, "error|warn|info|debug",
     "Most verbose level passed to the log callback."},
    {"quant.type", KeyType::Enum, "nf4", 0, 0, "nf4|int8|keep",
     "How base linear weights are stored: NF4 (bitsandbytes layout), INT8 row-wise absmax, or "
     "kept as in the file (GGUF blocks or floats). Pre-quantized bitsandbytes weights stay as "
     "they are."},
    {"quant.double_quant", KeyType::Bool, "true", 0, 0, "",
     "NF4 only: quantize the per-block absmax again to 8 bits (blocks of 256), as "
     "bnb_4bit_use_double_quant."},
    {"quant.blocksize", KeyType::Int, "64", 64, 4096, "",
     "NF4 only: elements per absmax block (bitsandbytes default 64; a power of two)."},
    {"seed", KeyType::Int, "42", 0, 9007199254740991.0, "",
     "Seed for everything random: LoRA init, dropout masks, data shuffling, sampling."},
    {"lora.r", KeyType::Int, "8", 1, 65536, "", "LoRA rank."},
    {"lora.alpha", KeyType::Float, "16", 1e-6, 1e9, "",
     "LoRA alpha: the update is scaled by alpha / r (alpha / sqrt(r) with lora.use_rslora)."},
    {"lora.dropout", KeyType::Float, "0", 0, 0.999, "",
     "Dropout probability on the LoRA input (PEFT lora_dropout); 0 disables it."},
    {"lora.target_modules", KeyType::List,
     "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", 0, 0,
     "q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|qkv_proj|gate_up_proj|w1|w2|w3|"
     "gate",
     "Projections that get a LoRA adapter (PEFT names; a fused model's (phi3) qkv_proj and "
     "gate_up_proj, adapted whole). On a mixture-of-experts layer gate_proj / up_proj (Mixtral's "
     "w1 / w3, taken together) adapt every expert's fused gate_up_proj at rank 2r and alpha 2 "
     "alpha, down_proj (w2) its down_proj, and gate the router, as PEFT 0.21's target_parameters "
     "(no dropout or DoRA there; a dense layer's MLP in such a model stays frozen, "
     "as PEFT leaves it)."},
    {"lora.use_rslora", KeyType::Bool, "false", 0, 0, "",
     "Rank-stabilized LoRA: scale alpha / sqrt(r) instead of alpha / r."},
    {"lora.use_dora", KeyType::Bool, "false", 0, 0, "",
     "DoRA (PEFT use_dora): each adapted output row is scaled to a trained magnitude m, "
     "y = m / norm(W + s B A) * (W + s B A) x with the row norm not differentiated; m starts at "
     "the base rows' norms. CPU backend, one rank, resident weights."},
    {"lora.init", KeyType::Enum, "default", 0, 0, "default|loftq|pissa|olora",
     "LoRA start: default is PEFT's (A kaiming-uniform, B zero); loftq (NF4 base, PEFT's "
     "replace_lora_weights_loftq) sets s B A to the rank-r SVD of the quantization error "
     "W - dequant(NF4(W)), W read again from the model file, so the adapter starts by cancelling "
     "it (PEFT leaves out the scale s = alpha / r; both agree at alpha = r); pissa (rank-r SVD of "
     "W) and olora (QR of W) start A and B on W's leading part and subtract that start from the "
     "base as a frozen copy (the shared base is not rewritten); the adapter exports as PEFT's "
     "converted rank-2r LoRA on the original base. CPU backend, one rank, resident weights."},
    {"data.path", KeyType::String, "", 0, 0, "",
     "Training data: a .txt, .jsonl or .json file, or a directory of them (read in name order)."},
    {"data.format", KeyType::Enum, "auto", 0, 0, "auto|text|alpaca|chat",
     "Record format: text ({\"text\"}), alpaca (instruction/input/output) or chat ({\"messages\": "
     "[{role, content}]}); auto looks at the first record. .txt files are always text."},
    {"data.template", KeyType::Enum, "auto", 0, 0, "auto|chatml|llama3|llama2|mistral|alpaca|none",
     "How alpaca and chat records are rendered; auto recognizes the model's chat template and "
     "falls back to alpaca."},
    {"data.train_on", KeyType::Enum, "completion", 0, 0, "completion|all",
     "Alpaca/chat records: train only on responses/assistant turns (with their end-of-turn "
     "token), or on every token. Text documents always train on every token."},
    {"data.seq_len", KeyType::Int, "512", 2, 1048576, "", "Tokens per training row."},
    {"data.pack", KeyType::Bool, "true", 0, 0, "",
     "Pack several documents into each row (attention stays inside each document); false puts "
     "one document per row, padded."},
    {"data.overflow", KeyType::Enum, "split", 0, 0, "split|truncate|reject",
     "A document longer than data.seq_len is split into pieces, truncated, or rejected as a bad "
     "record (see data.on_error)."},
    {"data.separator", KeyType::String, "\\n\\n", 0, 0, "",
     "Document separator in .txt files, with \\n and \\t escapes (e.g. <|endoftext|>); \\n\\n "
     "splits at blank lines; none makes each file one document."},
    {"data.eval_fraction", KeyType::Float, "0", 0, 0.5, "",
     "Fraction of the documents held out for evaluation (chosen from data.seed)."},
    {"data.seed", KeyType::Int, "1234", 0, 9.2e18, "",
     "Seed of the train/eval split, packing order and per-epoch shuffling."},
    {"data.epochs", KeyType::Int, "1", 1, 1000000, "", "Passes over the training rows."},
    {"data.on_error", KeyType::Enum, "fail", 0, 0, "fail|skip",
     "A bad record (invalid JSON, missing field, wrong type, empty text, too long) stops with an "
     "error naming file and line, or is skipped and counted."},
    {"data.max_record_bytes", KeyType::Size, "1M", 0, 0, "",
     "Longest record (a JSON line or record, a .txt document) accepted; 0 = no limit."},
    {"data.vars", KeyType::List, "", 0, 0, "",
     "Placeholders filled in every record before rendering: name=Qlft,author=Acme replaces "
     "{{name}} and {{author}}."},
    {"optim.name", KeyType::Enum, "adamw", 0, 0, "adamw|adamw8bit|paged_adamw8bit",
     "Optimizer: AdamW with fp32 state (torch.optim.AdamW), 8-bit AdamW (bitsandbytes AdamW8bit: "
     "blockwise 8-bit state, fp32 for tensors under 4096 elements), or the same with its state "
     "in a paged store (files in offload.dir on CPU; on CUDA managed memory that the driver "
     "pages to the host under memory pressure, prefetched to the device each step, as "
     "bitsandbytes' PagedAdamW8bit). On CUDA with one rank all three step on the device; "
     "otherwise on the host."},
    {"optim.lr", KeyType::Float, "2e-4", 0, 10, "", "Peak learning rate (after warmup)."},
    {"optim.beta1", KeyType::Float, "0.9", 0, 0.999999, "", "AdamW first-moment decay."},
    {"optim.beta2", KeyType::Float, "0.999", 0, 0.999999999, "", "AdamW second-moment decay."},
    {"optim.eps", KeyType::Float, "1e-8", 1e-30, 1, "",
     "AdamW epsilon, added outside the square root (above 0: a zero gradient would divide 0 "
     "by 0)."},
    {"optim.weight_decay", KeyType::Float, "0", 0, 10, "",
     "Decoupled weight decay: each step multiplies parameters by 1 - lr * weight_decay."},
    {"optim.max_grad_norm", KeyType::Float, "1", 0, 1e9, "",
     "Clip gradients to this global L2 norm before each optimizer step; 0 disables clipping."},
    {"optim.loraplus_lr_ratio", KeyType::Float, "1", 1e-6, 1e6, "",
     "LoRA+ (PEFT's create_loraplus_optimizer): every lora_B's learning rate (and its weight "
     "decay's) is this times optim.lr; 1 trains A and B at one rate (plain LoRA)."},
    {"sched.name", KeyType::Enum, "linear", 0, 0, "constant|linear|cosine",
     "Learning-rate schedule after the warmup (as transformers' get_*_schedule_with_warmup)."},
    {"sched.warmup_steps", KeyType::Int, "0", 0, 1e12, "",
     "Optimizer steps of linear warmup from 0 to optim.lr."},
    {"sched.min_lr_ratio", KeyType::Float, "0", 0, 1, "",
     "linear and cosine: the lr decays to optim.lr * min_lr_ratio instead of 0."},
    {"scaler.init_scale", KeyType::Float, "65536", 1e-30, 1e30, "",
     "fp16 only: initial dynamic loss scale."},
    {"scaler.growth_factor", KeyType::Float, "2", 1.000001, 1e6, "",
     "fp16 only: the scale is multiplied by this after scaler.growth_interval clean steps."},
    {"scaler.backoff_factor", KeyType::Float, "0.5", 1e-6, 0.999999, "",
     "fp16 only: on inf/nan gradients the step is skipped and the scale multiplied by this."},
    {"scaler.growth_interval", KeyType::Int, "2000", 1, 1e12, "",
     "fp16 only: clean steps in a row before the scale grows."},
    {"offload.optimizer", KeyType::Enum, "none", 0, 0, "none|cpu|nvme",
     "Where LoRA optimizer state lives. cpu: host memory; on backend=cuda the optimizer then "
     "steps on the host (gradients copied out per pass; on the cpu backend the state already "
     "is in host memory, so cpu is treated as none, with a warning). nvme: in an unlinked file "
     "under offload.dir, "
     "streamed tensor by tensor through offload.buffers buffers at each step (io_uring)."},
    {"offload.params", KeyType::Enum, "none", 0, 0, "none|cpu|nvme",
     "Where frozen base weights live between uses. cpu: host memory; on backend=cuda each "
     "unit (embedding, layer, head) is copied to the device while it is used, the next one "
     "queued behind it (treated as none on the cpu backend, with a warning). nvme: in an unlinked "
     "file under offload.dir; each unit "
     "(embedding, layer, head) is read back while it is used, the next one read ahead "
     "(io_uring). Generation and merged export then need the model loaded again."},
    {"offload.buffers", KeyType::Int, "2", 1, 64, "",
     "offload.*=nvme: buffers in flight besides the one in use (units of base weights read "
     "ahead; optimizer tensors read ahead or written back). Bounds the memory NVMe offload "
     "keeps resident."},
    {"offload.dir", KeyType::String, "", 0, 0, "",
     "Directory for paged optimizer state and other offloaded data (files are unlinked as soon "
     "as they are created); empty = the system temp dir ($TMPDIR or /tmp)."},
    {"dist.backend", KeyType::Enum, "none", 0, 0, "none|mpi|nccl",
     "How ranks talk: none (one process), mpi (CPU ranks started by mpirun; opens the MPI "
     "plugin libqlft-mpi.so beside libqlft, or $QLFT_MPI_PLUGIN, built with QLFT_MPI) or "
     "nccl (GPU ranks with backend=cuda, each on device local_rank % devices; NCCL's id "
     "sent over MPI; with optim.name=adamw gradients, optimizer step, weight exchange and "
     "ZeRO-3 shards stay on the devices). Each rank reads a disjoint "
     "shard of every global batch; only rank 0 writes logs, checkpoints and adapters."},
    {"dist.zero_stage", KeyType::Int, "0", 0, 3, "",
     "ZeRO sharding across ranks: 0 data parallel (gradients all-reduced), 1 also shards the "
     "LoRA optimizer state, 2 also reduce-scatters the gradients, 3 also shards the frozen "
     "base weights (each rank keeps a 1/world slice and all-gathers a layer while it is used, "
     "the next one prefetched)."},
    {"dist.zero3_shard_adapter", KeyType::Bool, "false", 0, 0, "",
     "ZeRO-3 on CPU ranks (dist.backend=mpi, backend=cpu): each rank keeps only the LoRA "
     "tensors it owns (their optimizer state and gradients are already its share) and receives "
     "a layer's others from their owners while the layer runs, as DeepSpeed ZeRO-3 partitions "
     "trainable parameters. Evaluation and saving the adapter then need every rank to call "
     "them (the CLI does); one rank alone cannot evaluate, generate or export."},
    {"dist.zero3_prefetch", KeyType::Enum, "auto", 0, 0, "auto|true|false",
     "ZeRO-3: true starts gathering the next layer's weights while the current one computes "
     "(two gathered layers in memory, DeepSpeed's prefetch); false gathers each one when it "
     "is used (one gathered layer less in memory). auto: true over NCCL, where the gather "
     "overlaps the compute, false over MPI, where it overlaps little (MPI moves the data "
     "inside its calls; no step-time difference was measured on CPU ranks)."},
    {"dist.row_chunk_kib", KeyType::Int, "2048", 1, 1048576, "",
     "ZeRO-3 on CPU ranks (dist.backend=mpi, backend=cpu): the f32 token embedding and output "
     "head are kept sharded by rows, never whole on a rank; the lookup exchanges only the rows "
     "each rank's tokens need, and the head is all-gathered for the cross-entropy in chunks of "
     "about this many KiB (two in memory at once). Smaller: less memory, more collectives."},
    {"dist.bucket_kib", KeyType::Int, "256", 1, 1048576, "",
     "Gradient and LoRA weight exchanges through host buffers (dist.backend=mpi) move at most "
     "this many KiB of each rank's share at once, like DeepSpeed's reduce / allgather bucket "
     "size: the exchange buffer holds world + 1 buckets. Smaller: less memory, more "
     "collectives."},
    {"dist.timeout_s", KeyType::Float, "300", 0.1, 1e7, "",
     "Seconds any collective may wait for the other ranks; past it every rank stops with "
     "QLFT_ERR_DISTRIBUTED naming the rank that did not answer."},
    {"train.micro_batch", KeyType::Int, "4", 1, 65536, "auto",
     "Sequences per micro-batch (one forward/backward), or auto: the largest that fits "
     "memory.limit (the free RAM when 0; with backend=cuda the device's budget, its free memory "
     "when 0), found by trial steps that back off on out-of-memory and cached in "
     "train.autotune_cache."},
    {"train.accumulation", KeyType::Int, "1", 1, 65536, "",
     "Micro-batches per optimizer step; the effective batch is micro_batch x accumulation x "
     "ranks."},
    {"train.effective_batch", KeyType::Int, "0", 0, 1e9, "",
     "Sequences per optimizer step over all ranks (micro_batch x accumulation x ranks); 0 = "
     "whatever micro_batch and accumulation give. When set, accumulation is derived from it; with "
     "micro_batch=auto the tuner picks the largest micro-batch that fits and divides it."},
    {"train.autotune_margin", KeyType::Float, "0.05", 0, 0.9, "",
     "micro_batch=auto: fraction of the memory budget kept free; a micro-batch fits when its "
     "trial step peaks below (1 - margin) x budget."},
    {"train.autotune_cache", KeyType::String, "", 0, 0, "",
     "micro_batch=auto: JSON file remembering the result per model, settings, device and "
     "memory.limit, so the next run skips the search; empty = train.output_dir/autotune.json, "
     "off = no cache."},
    {"train.max_steps", KeyType::Int, "0", 0, 1e15, "",
     "Optimizer steps to run; 0 runs data.epochs passes over the training split."},
    {"train.precision", KeyType::Enum, "fp32", 0, 0, "fp32|bf16|fp16",
     "Autocast precision of matmul inputs and stored activations; LoRA master weights and "
     "accumulation stay fp32. fp16 uses dynamic loss scaling (scaler.*)."},
    {"train.grad_checkpointing", KeyType::Int, "0", 0, 4096, "",
     "Gradient checkpointing: 0 off, 1 every layer, N every N-th layer (recomputed in backward)."},
    {"train.offload_checkpoints", KeyType::Enum, "auto", 0, 0, "auto|on|off",
     "With train.grad_checkpointing: each checkpointed layer's saved input goes to pinned host "
     "memory (bf16 under bf16/fp16, fp32 under fp32) on a copy stream during forward and comes "
     "back one layer ahead in backward; the device keeps two slots instead of one per layer. "
     "auto: on with a device backend exactly where the planned step exceeds memory.limit (with "
     "none, the device's free memory) without it; estimate says which it chose."},
    {"train.mlp_tile_rows", KeyType::Int, "auto", 0, 1e9, "auto",
     "With every layer checkpointed (train.grad_checkpointing 1): the MLP runs over row tiles of "
     "this many rows of the micro-batch (gate / up / down and their backward, recomputed per "
     "tile), so no [rows x intermediate] tensor is whole; 0: whole. auto: tiles of 256 MiB of "
     "fp32 intermediate activations (at least 256 rows), engaged when the micro-batch has more "
     "rows."},
    {"train.eval_every", KeyType::Int, "0", 0, 1e15, "",
     "Evaluate on the held-out split every N steps (0: only at the end)."},
    {"train.save_every", KeyType::Int, "0", 0, 1e15, "",
     "Write a resumable checkpoint every N steps (0: only at the end and on cancel)."},
    {"train.output_dir", KeyType::String, "qlft-out", 0, 0, "",
     "Where the CLI writes checkpoints, metrics.jsonl and the adapter."},
    {"train.on_nonfinite", KeyType::Enum, "skip", 0, 0, "skip|stop",
     "A step with inf/nan gradients is skipped and counted; with stop, training ends after "
     "train.max_nonfinite such steps in a row, with QLFT_ERR_NUMERICAL naming the layer and "
     "tensor where the first NaN/inf appeared."},
    {"train.max_nonfinite", KeyType::Int, "10", 1, 1e9, "",
     "Consecutive non-finite steps tolerated before train.on_nonfinite=stop ends training."},
    {"train.objective", KeyType::Enum, "sft", 0, 0, "sft|dpo|ipo|orpo|simpo|kto",
     "What the adapter is trained to: sft (next-token loss on the trained tokens), or a "
     "preference objective as TRL 1.16 computes it: dpo (DPOTrainer loss_type sigmoid), ipo "
     "(loss_type ipo), orpo (ORPOTrainer), simpo (CPOTrainer loss_type simpo) over "
     "{prompt, chosen, rejected} pairs, or kto (KTOTrainer) over {prompt, completion, label} "
     "examples. DPO, IPO and KTO take the reference log-probabilities from the same base with "
     "the adapter off. A dataset loaded under a preference objective (qlft_dataset_load, the "
     "CLI) reads data.path as such JSON lines (prompt / answers as strings, or as chat messages "
     "through data.template); a step takes train.micro_batch pairs (examples) per micro-batch. "
     "Preference data has no evaluation split, and a resumed run restarts its data order."},
    {"moe.aux_loss", KeyType::Enum, "auto", 0, 0, "auto|on|off",
     "Mixture-of-experts models: add moe.aux_loss_coef times the load-balancing auxiliary loss "
     "(transformers' load_balancing_loss_func over every MoE layer's router of the micro-batch) "
     "to the training loss and its gradient, as transformers does with output_router_logits. "
     "auto: as the model's config.json says (output_router_logits). Not with train.objective "
     "other than sft."},
    {"moe.aux_loss_coef", KeyType::Float, "auto", 0, 1e6, "auto",
     "The load-balancing loss's weight (moe.aux_loss). auto: the model's router_aux_loss_coef "
     "(transformers' default 0.001 when config.json does not state it)."},
    {"pref.beta", KeyType::Float, "0.1", 1e-6, 1e6, "",
     "Preference objectives' beta (TRL's): DPO / KTO / SimPO temperature, IPO's regularization "
     "tau, ORPO's lambda (weight of the odds-ratio term)."},
    {"pref.label_smoothing", KeyType::Float, "0", 0, 0.5, "",
     "simpo: CPOTrainer's label_smoothing (conservative loss: the pair's label flipped with this "
     "probability)."},
    {"pref.simpo_gamma", KeyType::Float, "0.5", 0, 1e6, "",
     "simpo: target reward margin gamma (CPOConfig.simpo_gamma)."},
    {"pref.cpo_alpha", KeyType::Float, "0", 0, 1e6, "",
     "simpo: weight of the NLL term on the chosen answers (CPOConfig.cpo_alpha; TRL's default "
     "1.0 is CPO's, SimPO uses 0)."},
    {"pref.desirable_weight", KeyType::Float, "1", 0, 1e6, "",
     "kto: weight of the desirable examples' losses (KTOConfig.desirable_weight)."},
    {"pref.undesirable_weight", KeyType::Float, "1", 0, 1e6, "",
     "kto: weight of the undesirable examples' losses (KTOConfig.undesirable_weight)."},
    {"pref.precompute_ref", KeyType::Bool, "false", 0, 0, "",
     "dpo / ipo / kto: compute every example's reference log-probabilities once before the first "
     "step (TRL's precompute_ref_log_probs) and keep them in <data.path>.qlft-ref-<key>.bin, "
     "keyed by the model as stored, the backend, the precision and the examples' tokens: a "
     "resumed run, a second epoch or another run on the same data skips the reference pass."},
    {"lora.init_from", KeyType::String, "", 0, 0, "",
     "A PEFT adapter directory to start from: its r, alpha, target modules and rsLoRA setting "
     "replace lora.* and its weights are loaded (for generation, evaluation or further training)."},
    {"generate.max_tokens", KeyType::Int, "128", 1, 1048576, "", "Tokens to generate at most."},
    {"generate.temperature", KeyType::Float, "0", 0, 100, "",
     "Sampling temperature; 0 is greedy decoding."},
    {"generate.top_k", KeyType::Int, "0", 0, 1e9, "",
     "Sample only among the k most likely tokens (0: no limit)."},
    {"generate.top_p", KeyType::Float, "1", 1e-6, 1, "",
     "Nucleus sampling: the smallest set of tokens whose probability reaches top_p."},
    {"generate.seed", KeyType::Int, "0", 0, 9007199254740991.0, "", "Seed of the sampler."},
    {"generate.stop_at_eos", KeyType::Bool, "true", 0, 0, "",
     "Stop when the model emits its end-of-sequence token."},
    {"generate.chat", KeyType::Bool, "false", 0, 0, "",
     "Answer the prompt as a chat: it becomes one user turn of the template training uses "
     "(data.template, with the model's default system prompt) followed by the assistant's "
     "header, as transformers' apply_chat_template(add_generation_prompt=True). false: the "
     "prompt is plain text."},
};
constexpr size_t kKeyCount = sizeof(kKeys) / sizeof(kKeys[0]);

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool in_choices(const char* choices, const std::string& v) {
  std::stringstream ss(choices);
  std::string item;
  while (std::getline(ss, item, '|'))
    if (item == v) return true;
  return false;
}

std::string range_text(const KeyDef& k) {
  // Integer limits are printed whole (9007199254740991, not 9.0072e+15, which is not the limit).
  const double whole_below = k.type == KeyType::Int ? 9.3e18 : 1e15;
  auto num = [whole_below](double d) {
    if (d == std::floor(d) && std::fabs(d) < whole_below)
      return strf("%lld", static_cast<long long>(d));
    return strf("%g", d);
  };
  if (k.min <= kNoMin && k.max >= kNoMax) return "";
  if (k.max >= kNoMax) return ">= " + num(k.min);
  return num(k.min) + ".." + num(k.max);
}
}  // namespace

size_t key_count() {
  return kKeyCount;
}
const KeyDef& key_at(size_t i) {
  return kKeys[i];
}

const KeyDef* find_key(const std::string& name) {
  for (const KeyDef& k : kKeys)
    if (name == k.name) return &k;
  return nullptr;
}

const char* key_type_name(KeyType t) {
  static const char* const names[] = {"int", "float", "bool", "string", "enum", "size", "list"};
  return enum_name(names, t);
}

std::string key_allowed(const KeyDef& k) {
  switch (k.type) {
    case KeyType::Int:
      return *k.choices ? range_text(k) + " or " + k.choices : range_text(k);
    case KeyType::Float:
      return *k.choices ? range_text(k) + " or " + k.choices : range_text(k);
    case KeyType::Bool:
      return "true|false";
    case KeyType::Enum:
      return k.choices;
    case KeyType::List:
      return *k.choices ? strf("comma-separated from %s", k.choices) : "comma-separated";
    case KeyType::Size:
      return "bytes, or with K/M/G/T";
    case KeyType::String:
      return "";
  }
  return "";
}

std::string validate_value(const KeyDef& k, const std::string& raw) {
  std::string v = trim(raw);
  switch (k.type) {
    case KeyType::Int: {
      // An int key may also accept words listed in choices (train.micro_batch=auto).
      if (*k.choices && in_choices(k.choices, lower(v))) return lower(v);
      errno = 0;
      char* end = nullptr;
      long long x = std::strtoll(v.c_str(), &end, 10);
      if (!v.empty() && *end != '\0' && errno == 0) {
        // Exponent notation ("1e15", as range_text prints large limits) for a whole number.
        char* dend = nullptr;
        double d = std::strtod(v.c_str(), &dend);
        if (*dend == '\0' && std::isfinite(d) && d == std::floor(d) &&
            std::fabs(d) < 9.22e18) {  // below 2^63
          x = static_cast<long long>(d);
          end = dend;
        }
      }
      if (v.empty() || *end != '\0' || errno != 0)
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be an integer, got '%s'", k.name,
                    raw.c_str());
      if (static_cast<double>(x) < k.min || static_cast<double>(x) > k.max)
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be in %s, got %lld", k.name,
                    range_text(k).c_str(), x);
      return std::to_string(x);
    }
    case KeyType::Float: {
      // A float key may also accept words listed in choices (moe.aux_loss_coef=auto).
      if (*k.choices && in_choices(k.choices, lower(v))) return lower(v);
      errno = 0;
      char* end = nullptr;
      double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x))
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be a finite number, got '%s'", k.name,
                    raw.c_str());
      if (x < k.min || x > k.max)
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be in %s, got %s", k.name,
                    range_text(k).c_str(), v.c_str());
      return v;
    }
    case KeyType::Bool: {
      std::string l = lower(v);
      if (l == "true" || l == "1" || l == "yes" || l == "on") return "true";
      if (l == "false" || l == "0" || l == "no" || l == "off") return "false";
      throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be true or false, got '%s'", k.name,
                  raw.c_str());
    }
    case KeyType::Enum: {
      std::string l = lower(v);
      if (!in_choices(k.choices, l))
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be one of %s, got '%s'", k.name, k.choices,
                    raw.c_str());
      return l;
    }
    case KeyType::Size:
      parse_bytes(v, k.name);
      return v;
    case KeyType::List: {
      std::string out;
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        item = trim(item);
        if (item.empty()) continue;
        if (*k.choices && !in_choices(k.choices, item))
          throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s: '%s' is not one of %s", k.name, item.c_str(),
                      k.choices);
        if (!out.empty()) out += ",";
        out += item;
      }
      return out;
    }
    case KeyType::String:
      return v;
  }
  return v;
}

}  // namespace qlft
