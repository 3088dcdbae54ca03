// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/sequence/kv_sequence.h
// KvSequence: the stored KV cache of one sequence, per layer and per KV head, in pool pages.
// Each (layer, head) stream holds full-precision rows (the method's sink tokens, then the tail of
// not-yet-quantized tokens), a list of quantized block records and the position of every token it
// keeps; OScaR layers also hold one norm per quantized token. Tokens move from the tail into
// records per the layer's StreamingRules (kernels/quant_types.h): when the tail holds
// flush_tokens tokens they are quantized once, as flush_tokens / block_tokens records.
//
// Storage is ragged: with eviction on (EvictionSettings), each head keeps its own tokens under its
// own budget, checked after every append, and the never-evicted first tokens stay fp16 sink rows.
// Evicting tokens that live in records compacts that head (docs/budgets.md): a record whose tokens
// all stay keeps its bytes (moved down past dropped records), a record that loses every token is
// dropped, and the kept tokens of partly evicted records are decoded, rounded to fp16 and
// re-quantized into fresh full records (a remainder waits in the fp16 tail). Sinks and the
// protected recent window are never evicted. OScaR's token norm spans the heads of a layer, so
// eviction with OScaR is refused at config load.
//
// Rows of the sink and tail are stored as fp16 when the layer quantizes, so a token's path to its
// record does not depend on how appends were batched. A lossless layer (quant.method = "none")
// never flushes and stores rows in the session dtype: reads return exactly what was appended.
//
// Append is all or nothing: it validates everything, scores and evicts, quantizes into temporary
// memory, reserves every page it needs in one allocation, and only then changes stored state. On
// any error (bad shape, NaN, fp16 overflow, missing Q, RESOURCE_EXHAUSTED) the sequence is
// unchanged.
//
// Integrity: with page checksums on (PageAllocator::checksums) every method that writes seals the
// pages it changed before it returns, Verify checks the pages a FETCH reads and Scrub walks all
// of them a slice at a time. The first mismatch found marks the sequence lost: from then on
// Append, LowerWidth and Verify answer the same DATA_LOSS and nothing rewrites (and so re-seals)
// its pages.
//
// Thread safety: none; callers serialise operations on one sequence (the daemon holds a
// per-sequence mutex).
#ifndef KVCTL_CONTROLLER_SEQUENCE_KV_SEQUENCE_H_
#define KVCTL_CONTROLLER_SEQUENCE_KV_SEQUENCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "controller/pool/pool.h"
#include "controller/pool/slot_array.h"
#include "controller/sequence/eviction_driver.h"
#include "controller/sequence/host_memory.h"
#include "kernels/quant_types.h"
#include "policies/joint_planner.h"
#include "policies/width_relief.h"

namespace kvctl {

// How one layer stores its heads. All heads of a layer share the method, block and rules (OScaR's
// token norm spans the heads); bit widths may differ per head.
struct LayerPlan {
  bool lossless = false;              // Never quantize; rows in the session dtype.
  StreamingRules rules;               // Ignored when lossless.
  std::vector<QuantSpec> head_specs;  // One per KV head.
};

struct SequenceGeometry {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kF32;  // Session dtype: appended data and lossless rows.
  // Live quality telemetry: every Nth record of a head is decoded right after it is quantized
  // and its relative reconstruction error recorded; with queries, a head's first compression and
  // every Nth after it measure the attention mass the kept tokens retain. 0 = off.
  int quality_sample_period = 0;
  int q_heads = 0;  // Query heads of the Q an append may carry (0 = never).
  // quant.flush_spread_steps: the flushes of the quantized layers that fall due together are
  // spread over this many appends (at most flush_tokens), at most ceil(quantized layers / steps)
  // layers per append; a held layer's tail grows up to steps - 1 rows past flush_tokens
  // meanwhile. 1 = every due layer flushes at once. The records are the same either way (a flush
  // always takes whole flush_tokens groups from the front of the tail); only when they are
  // written changes.
  int flush_spread_steps = 1;
  // quant.flush_after_reply: a decode step whose tails reach flush_tokens only stores its rows
  // (AppendIsLight); PrepareHeldFlushStep encodes that flush's records ahead (the daemon, on a
  // worker after the reply) and the next append writes them. A tail may grow up to
  // kMaxHeldFlushRows - 1 rows past flush_tokens before an append flushes it on the request path
  // itself. The records are the same.
  bool flush_after_reply = false;
};

// How far past flush_tokens a tail may grow while its flush waits for PrepareHeldFlushStep
// (SequenceGeometry::flush_after_reply); sequence images accept tails up to flush_tokens +
// kMaxFlushSpreadSteps - 2, so this stays below kMaxFlushSpreadSteps.
inline constexpr int kMaxHeldFlushRows = 16;
static_assert(kMaxHeldFlushRows < kMaxFlushSpreadSteps);

// What an APPEND does when the pool cannot give it the pages it needs (budget.pressure).
struct PressureSettings {
  // false: RESOURCE_EXHAUSTED and nothing changes. true: first lower the code widths of this
  // sequence's stored records (PlanWidthRelief, LowerWidth) to free the shortfall, then retry once.
  bool lower_widths = false;
  int min_bits = 2;                // No head goes below this width.
  std::vector<WidthCurve> curves;  // Per (layer, head); empty = the default model.
  // joint sequences: the planner input of their plan. The relief then asks AdviseShortfall
  // whether lowering widths or evicting (lowering the heads' token caps) adds less predicted
  // distortion, and does that.
  std::shared_ptr<const JointPlanInput> joint;
};

// Per (layer, head) usage and sampled quality, for STATS.
struct HeadUsage {
  int64_t tokens = 0;
  uint64_t elements = 0;       // K and V elements: 2 * tokens * head_dim.
  uint64_t payload_bytes = 0;  // Rows + records (+ this head's share of OScaR norms).
  int k_bits = 16, v_bits = 16;
  uint64_t quality_samples = 0;
  double k_rel_error_sum = 0, v_rel_error_sum = 0;  // Sum over samples of ||x - x^||^2 / ||x||^2.
  int64_t budget = 0;           // Token cap after the last append; 0 = no eviction.
  uint64_t evicted_tokens = 0;  // Tokens evicted so far.
  uint64_t evicted_bytes = 0;   // Payload bytes those tokens held (fp16 rows for new tokens).
  uint64_t compressions = 0;    // Appends that evicted from this head.
  // Kept tokens that compaction decoded out of records: they are quantized again (error compounds).
  uint64_t requantized_tokens = 0;
  uint64_t width_lowerings = 0;  // Times LowerWidth re-quantized this head's records narrower.
  // Evictions with queries that measured it (SequenceGeometry::quality_sample_period), and the
  // sum of the attention mass of the observation queries that the kept tokens hold.
  uint64_t retained_samples = 0;
  double retained_mass_sum = 0;
};

// Dense rows of a layer range, concatenated per (layer, head) in that order.
struct DenseKv {
  std::vector<uint32_t> counts;    // [layers * kv_heads] tokens per (layer, head).
  std::vector<int64_t> positions;  // Per row.
  std::vector<float> k, v;         // Per row, head_dim floats each.
};

// Caller-owned destination of KvSequence::FetchDenseInto (e.g. the frames of a FETCH reply).
struct DenseOut {
  DType dtype = DType::kF32;
  void* k = nullptr;          // Per row, head_dim elements of dtype.
  void* v = nullptr;          // Same.
  void* positions = nullptr;  // Per row, one int64.
};

// Where one (layer, head) keeps its records, for readers that map the pool (blocks-mode FETCH).
// A view into the sequence, valid until it changes.
struct HeadBlocks {
  std::span<const uint32_t> record_ids;  // Slot ids in order: page * records_per_page + slot.
  uint64_t records_stamp = 0;            // SlotArray::stamp() of the records' array.
  uint32_t records = 0;                  // Records in use.
  uint32_t records_per_page = 0;
  uint32_t sink_rows = 0, tail_rows = 0;
  int64_t first_quantized_position = 0;
};

// Where one (layer, head) keeps its full-precision window (sink rows, then tail rows) in the pool,
// for readers that map it (blocks-mode FETCH). Views into the sequence, valid until it changes.
struct HeadWindow {
  std::span<const uint32_t> ids;            // Row slot ids: page * slots_per_page + slot.
  std::span<const int64_t> sink_positions;  // Of the first sink_positions.size() rows.
  std::span<const int64_t> tail_positions;  // Of the rest.
  DType dtype = DType::kF16;                // Of each K and V row.
  uint32_t slot_bytes = 0;                  // A slot holds the K row, then the V row.
  uint32_t slots_per_page = 0;
};

struct SequenceUsage {
  int64_t tokens = 0;           // Appended so far (the next position is first_position + this).
  int64_t kept_tokens = 0;      // Summed over (layer, head): what the cache holds now.
  uint64_t evicted_tokens = 0;  // Summed over (layer, head).
  uint64_t evicted_bytes = 0;
  int64_t quantized_tokens = 0;     // Per head, in records (layer 0, head 0).
  uint64_t pool_bytes = 0;          // Whole pages held (reserved): every slab's pages.
  uint64_t payload_bytes = 0;       // Bytes of records, rows and norms in use (no page slack).
  uint64_t shared_bytes = 0;        // Of those, bytes in slots borrowed from a frozen prefix.
  uint64_t elements = 0;            // K and V elements stored (2 * kept_tokens * D).
  uint64_t pressure_reliefs = 0;    // Reliefs of a full pool: widths lowered or caps cut.
  uint64_t pressure_cap_cuts = 0;   // Of those, joint reliefs that lowered token caps instead.
  uint64_t lowered_for_others = 0;  // Times its widths were lowered for another sequence.
  int64_t deferred_tokens = 0;      // Stored un-evicted by APPEND_CONTINUES, awaiting the end.
  uint64_t deferred_appends = 0;    // Appends that deferred their eviction.
  uint64_t deferral_cap_hits = 0;   // Flagged appends past evict.max_deferred_tokens: evicted.
};

struct PreparedHead;   // What an append writes into one head (kv_sequence_internal.h).
struct PreparedLayer;  // ... and into one layer.

class KvSequence {
 public:
  // REQUIRES: plans.size() == geometry.layers, every spec valid with head_dim == geometry.head_dim;
  // no OScaR layer when eviction is enabled.
  KvSequence(PageAllocator* pool, const SequenceGeometry& geometry, std::vector<LayerPlan> plans,
             EvictionSettings eviction = {}, PressureSettings pressure = {});
  ~KvSequence();
  KvSequence(const KvSequence&) = delete;
  // Host memory (outside the pool) of an empty sequence of this shape, before it is built
  // (controller/sequence/host_memory.h).
  static uint64_t HostBytesAtOpen(const HostShape& shape);
  KvSequence& operator=(const KvSequence&) = delete;

  // A sequence equal to `source` (the same rows, records, positions and later behaviour as an
  // import of source's whole image) that shares source's records, sink rows and OScaR norms
  // copy-on-write instead of copying them: their pool slots are borrowed (SlotArray::Borrow), and
  // only the fp16 tails of quantized layers are copied (a lossless layer's rows are shared too).
  // `source` must never change again (a frozen prefix of the daemon's prefix cache,
  // controller/service/prefix_cache.h); the fork keeps it alive. The fork's appends only add slots
  // after the borrowed ones, and LowerWidth first moves a head's records to fresh slots of its own;
  // pressure relief does not lower heads that borrow records (that would take pages, not free
  // them). Usage counters start at zero, as a prefix import's. FAILED_PRECONDITION for a lost
  // source or one with eviction on (forks never evict: eviction rewrites records in place);
  // RESOURCE_EXHAUSTED when the pool lacks the tail's pages.
  static StatusOr<std::unique_ptr<KvSequence>> Fork(std::shared_ptr<const KvSequence> source,
                                                    int quality_sample_period,
                                                    PressureSettings pressure = {});
  // The other direction, for the sequence a frozen prefix was saved from: its first slots are
  // replaced by the prefix's (borrowed, as a fork's) and its own copies go back to the pool, so
  // the saver holds the prefix once with its forks. Every shared slot is compared byte for byte
  // first. Returns the pool bytes freed; FAILED_PRECONDITION naming what differs (nothing changes
  // then) when `prefix` is not this sequence's prefix, when eviction is on, or when the sequence
  // already shares slots of a prefix that `prefix` does not cover; the sequence's DATA_LOSS when
  // it is lost.
  StatusOr<uint64_t> ShareWith(std::shared_ptr<const KvSequence> prefix);

  // Appends n_tokens tokens at positions first_position... k[l], v[l] are [n_tokens, kv_heads,
  // head_dim] views of layer l. The first append fixes the sequence's start position; later ones
  // must continue it (INVALID_ARGUMENT "first_position: got X, expected Y"). q (may be null) holds
  // [n_tokens, q_heads, head_dim] views per layer; INVALID_ARGUMENT naming "q" when the eviction
  // policy reads queries and q is null. With eviction on, every head holds at most its budget
  // when Append returns OK. When the pool lacks pages: RESOURCE_EXHAUSTED with the sequence
  // unchanged, or, with PressureSettings::lower_widths, the widths of stored records are lowered
  // first (kept even if the retry still finds no pages, e.g. taken by another sequence meanwhile).
  // allow_relief = false: a full pool answers RESOURCE_EXHAUSTED with nothing changed, even with
  // lower_widths (callers that must not do slow work, the daemon's I/O thread).
  // continues (APPEND_CONTINUES): more tokens of the same prefill follow. With eviction on and
  // while the tokens stored since the last evicting append stay within
  // eviction.max_deferred_tokens, the append stores its tokens and folds its queries into the
  // scorer state (h2o; snapkv / rkv keep the newest observation rows) but neither scores, evicts
  // nor flushes: heads may then hold more than their budget. The next append without the flag
  // (or past the cap) evicts over everything, with the same result as one append of every
  // token. Without eviction the flag changes nothing.
  Status Append(int64_t first_position, const std::vector<KvTensorView>& k,
                const std::vector<KvTensorView>& v, const std::vector<KvTensorView>* q = nullptr,
                bool allow_relief = true, bool continues = false);
  // Runs parts 0..parts-1 of a job, each exactly once, possibly on two threads at once, and
  // returns when all are done (the controller's HelperThread::RunShared).
  using PartsRunner = std::function<void(size_t parts, const std::function<void(size_t)>& run)>;
  // Appends that take the stages over at least min_tokens tokens (their own, plus, for the append
  // that ends a prefill sent with APPEND_CONTINUES, the pieces stored before it) prepare their
  // layers through `runner`, one part per layer: each layer's Prepare reads the sequence and
  // writes only its own plan, so the plans, and everything committed from them, are those of one
  // layer after another. A null runner or min_tokens <= 0 (the default): one layer after another
  // on the calling thread. The runner is not copied: it must outlive the appends that use it (the
  // controller's, which outlives its sequences, is set before each APPEND: two stores).
  void SetPrepareRunner(const PartsRunner* runner, int64_t min_tokens);
  // Tokens stored by deferred appends since the last append that evicted (0 = none pending):
  // the sequence is in the middle of a prefill sent with APPEND_CONTINUES.
  int64_t deferred_tokens() const { return deferred_tokens_; }
  // True when an append of n tokens would only store rows: no flush into records, no eviction
  // (sequences with eviction are never light), the sequence not lost. Such an append costs about
  // a copy of its bytes. With flush_after_reply a tail reaching flush_tokens does not count, as
  // long as it stays under flush_tokens + kMaxHeldFlushRows.
  bool AppendIsLight(int64_t n) const;
  // flush_after_reply only: true when a quantized layer's tail holds flush_tokens rows or more
  // and the records of that flush are not prepared yet (PrepareHeldFlushStep has work).
  bool HeldFlushPending() const;
  // Encodes one more layer of the held flush (the records the next append would write, from the
  // stored rows) into a private buffer. Nothing a reader sees changes, so it may run while an
  // engine reads the page tables of its last FETCH. True once every layer is prepared: the next
  // append then commits those records instead of encoding them (a copy of the records and the
  // tails' shrink, which a FETCH's page tables may not outlive anyway). Any write to the sequence
  // meanwhile (an append) discards what was prepared; the next call starts over.
  StatusOr<bool> PrepareHeldFlushStep();

  // Re-quantizes every record of (layer, head) at k_bits / v_bits (each <= the current width, one
  // of them lower): decoded, rounded to fp16 and quantized again, in place, so the pages the
  // narrower records no longer need go back to the pool. Later flushes of the head use the new
  // widths. INVALID_ARGUMENT naming the field for a lossless layer, a width that is not lower or
  // not allowed; nothing changes then.
  Status LowerWidth(int layer, int head, int k_bits, int v_bits);

  // For another sequence's APPEND (budget.pressure_scope = "pool"): lowers the widths of this
  // sequence's stored records (PlanWidthRelief, partial) to free up to `pages` pages; returns the
  // pages freed (0 when pressure relief is off for this sequence or nothing can be lowered).
  int64_t LowerWidthsForOthers(int64_t pages);
  // Pages the last APPEND that failed for want of pool pages lacked (0 if none failed so).
  int64_t last_shortfall_pages() const { return last_shortfall_pages_; }

  // Dequantized rows of layers [layer_begin, layer_end), in token order per (layer, head), with
  // the kept tokens' true positions.
  // REQUIRES: 0 <= layer_begin < layer_end <= layers.
  DenseKv FetchDense(int layer_begin, int layer_end) const;
  // FetchDense's counts alone: rows per (layer, head), to size FetchDenseInto's buffers.
  std::vector<uint32_t> DenseCounts(int layer_begin, int layer_end) const;
  // FetchDense written straight into caller memory as out.dtype, each element exactly as
  // FetchDense's float converted by FloatToHalf / FloatToBf16 (stored rows already in out.dtype
  // are copied byte for byte). Decodes one record at a time into a small fp32 scratch, so no fp32
  // copy of the range is made. REQUIRES: the ranges of FetchDense; out.k and out.v hold
  // rows * head_dim elements of out.dtype and out.positions rows int64 (rows = the sum of
  // DenseCounts), at any alignment.
  void FetchDenseInto(int layer_begin, int layer_end, const DenseOut& out) const;
  // Part of FetchDenseInto, for decoding one FETCH on several threads: the work of layers
  // [layer_begin, layer_end) counted in units, per (layer, head) in order: its sink rows (256
  // to a unit), each record (a unit each), its tail rows (256 to a unit) and its positions (one
  // unit); DenseUnits counts them. Writes only what units [unit_begin, unit_end) write (unit_end
  // may pass the last), at the offsets FetchDenseInto would, so calls over disjoint ranges may run
  // at once and together write what one FetchDenseInto writes.
  size_t DenseUnits(int layer_begin, int layer_end) const;
  void FetchDenseUnitsInto(int layer_begin, int layer_end, const DenseOut& out, size_t unit_begin,
                           size_t unit_end) const;

  // Record locations of one (layer, head).
  HeadBlocks Blocks(int layer, int head) const;
  const QuantSpec& HeadSpec(int layer, int head) const;
  bool Lossless(int layer) const;
  // OScaR layers: pages of the per-record norm slots (block_tokens fp32 each), in record order.
  const SlotArray* Norms(int layer) const;
  // Where the full-precision rows (sinks, then tail) of one (layer, head) are.
  HeadWindow FetchWindow(int layer, int head) const;

  // Page checksums of layers [layer_begin, layer_end) (rows, records, norms, borrowed slots
  // included) as a FETCH checks them (pool.verify_on_fetch: the chunks not verified since they
  // were written, or all): OK, or the DATA_LOSS that marks the sequence lost (also when it was
  // lost before). With `budget` (the daemon's I/O thread) nothing is checked when more than its
  // max_bytes are left to check: budget->exceeded is set and OK returned.
  // REQUIRES: 0 <= layer_begin < layer_end <= layers.
  Status Verify(int layer_begin, int layer_end, PageAllocator::VerifyBudget* budget = nullptr);
  // Verifies the sequence's next pages, from where the last call stopped, until about max_bytes
  // were checksummed or every page was, and at the end of each walk the chunks of the slots it
  // borrows from a frozen prefix (FETCH no longer re-checks a chunk it verified, so the scrubber
  // is what finds a later change, also after the prefix left the cache); *wrapped says the walk
  // reached the end (and starts over next time). Returns the bytes checksummed, or the DATA_LOSS
  // that marks the sequence lost.
  StatusOr<uint64_t> Scrub(uint64_t max_bytes, bool* wrapped);
  // OK, or the DATA_LOSS that marked the sequence lost.
  const Status& integrity() const { return integrity_; }

  SequenceUsage Usage() const;
  // Usage().kept_tokens and .quantized_tokens without the rest (what every APPEND reads).
  int64_t KeptTokens() const;
  int64_t QuantizedTokens() const;
  HeadUsage HeadUsageOf(int layer, int head) const;
  // R-KV: the redundancy state the head's next scoring starts from, with what the last scoring
  // spent (policies/redundancy.h); empty for other policies.
  const RedundancyState& RedundancyStateOf(int layer, int head) const;
  // Quality samples and error sums over every (layer, head).
  HeadUsage QualityTotals() const;
  int64_t tokens() const { return tokens_; }
  // Slots compaction has moved between pages so far (docs/algorithms.md §16).
  uint64_t slots_moved() const { return slabs_.slots_moved(); }
  // Whether the sequence reads slots it borrowed from a frozen prefix (Fork).
  bool shares_pages() const { return lender_ != nullptr; }
  // Tokens the layer's heads may hold together after the last append (0 = no eviction).
  int64_t LayerBudget(int layer) const;
  const EvictionSettings& eviction() const { return eviction_; }
  const PressureSettings& pressure() const { return pressure_; }
  const SequenceGeometry& geometry() const { return geometry_; }
  int64_t first_position() const { return first_position_; }

 private:
  // Export and import of sequence images (controller/sequence/kv_sequence_image.cc) read and
  // rebuild the stored state directly.
  friend struct SequenceImageAccess;
  struct HeadStream;
  struct LayerState;

  struct AppendContext;
  // The pages an append reserved, and whether the slabs that shrink are compacted between its
  // shrinks and its growth (a full pool).
  struct Reservation {
    std::vector<uint32_t> pages;
    bool compact_between = false;
  };
  // The stages of an APPEND (kv_sequence_pipeline.cc; Prepare is AppendLayerPrepare).
  // relief_rounds: how many more times a full pool may be relieved before failing.
  Status AppendOnce(int64_t first_position, const std::vector<KvTensorView>& k,
                    const std::vector<KvTensorView>& v, const std::vector<KvTensorView>* q,
                    int relief_rounds, bool continues);
  // The light append (AppendIsLight: rows only, no eviction, no tail reaching its flush) without
  // the per-head plan: takes the slots, then converts each new row straight from the request into
  // its slot, and commits what the stages would. False, with nothing changed, when the pool cannot
  // give the pages at once (the stages then relieve pressure) or a head tops up its sinks while
  // it holds a tail (never in a sequence the stages built; they handle it).
  bool TryAppendRows(int64_t first_position, int64_t n, const std::vector<KvTensorView>& k,
                     const std::vector<KvTensorView>& v, bool have_q);
  // The sequence-wide counters at the end of every committed append.
  void CommitCounters(int64_t first_position, const AppendContext& ctx);
  // Shapes, position and values of an append; returns its token count.
  StatusOr<int64_t> ValidateAppend(int64_t first_position, const std::vector<KvTensorView>& k,
                                   const std::vector<KvTensorView>& v,
                                   const std::vector<KvTensorView>* q) const;
  // The token budgets of an append of n tokens, and whether it defers its eviction.
  StatusOr<AppendContext> PlanAppend(int64_t n, bool have_q, bool continues) const;
  // flush_spread_steps > 1: which quantized layers whose tails reach flush_tokens in an append
  // of n tokens wait for a later append (ctx->held_flush). A layer whose tail would reach
  // flush_tokens + steps - 1 flushes; so do the others due, longest tail first (then the lowest
  // layer), until ceil(quantized layers / steps) layers flush in this append.
  void PlanFlushSpread(int64_t n, AppendContext* ctx) const;
  // budget.realloc_period: which layers re-split their heads' budgets in an append of n tokens
  // (ctx->realloc_due); all together, or staggered like compressions (evict.stagger_layers).
  void PlanReallocation(int64_t n, bool have_q, AppendContext* ctx) const;
  // Adds the slots layer l's prepared append needs to *plan.
  void CountSlots(int l, const PreparedLayer& p, SlabPlan* plan) const;
  // Every page the plan needs, in one allocation; RESOURCE_EXHAUSTED (with
  // last_shortfall_pages_ set) or DATA_LOSS with nothing changed.
  StatusOr<Reservation> ReservePages(const SlabPlan& plan);
  // Writes every prepared layer into the stored state. Cannot fail.
  void CommitAppend(int64_t first_position, const AppendContext& ctx,
                    std::vector<PreparedLayer>* prepared, const SlabPlan& slab_plan,
                    Reservation reservation);
  void CommitRecords(HeadStream& head, const PreparedHead& ph, std::vector<uint32_t>* reserved);
  void CommitRows(HeadStream& head, const PreparedHead& ph, std::vector<uint32_t>* reserved);
  void CommitHeadState(int64_t first_position, int64_t n, HeadStream& head, PreparedHead& ph);
  void CommitLayerState(LayerState& layer, PreparedLayer& p, std::vector<uint32_t>* reserved);
  // Frees `shortfall_pages`: lowers widths (PlanWidthRelief over every quantized head), or for a
  // joint sequence whichever of lowering widths and lowering token caps AdviseShortfall prices
  // lower (the caps take effect when the APPEND is prepared again).
  Status RelievePressure(int64_t shortfall_pages);
  // PlanWidthRelief over every quantized head, then LowerWidth; returns the pages freed.
  StatusOr<int64_t> LowerWidthsToFree(int64_t pages, bool partial);
  Status RelieveJoint(int64_t shortfall_pages);
  // Moves a head's records into the slab of `record_bytes` slots (contents undefined after it),
  // returning the pages the old slab no longer needs. RESOURCE_EXHAUSTED with nothing changed
  // when the pool lacks pages for it, DATA_LOSS when the old slab's pages fail their checksums.
  Status MoveRecords(SlotArray* records, size_t record_bytes);
  // LowerWidth without the publish: the relief paths lower several heads, then publish once.
  Status LowerWidthInPlace(int layer, int head, int k_bits, int v_bits);
  // Seals the pages this sequence wrote since the last call (pool checksums), or, for mirrored
  // pools (PageAllocator::mirrored), copies the bytes it changed to the device, so engines
  // reading the device copy see every completed request. UNAVAILABLE on a device copy error.
  // Every public method that writes calls it once before returning. Visits only the pages
  // written (Slab::TakeTouchedPages), so a decode step does not pay for the pages held.
  Status Publish();
  // Verify without the per-layer cache: the checks of the pool's chunks themselves.
  Status VerifyUncached(int layer_begin, int layer_end, PageAllocator::VerifyBudget* budget);
  // The byte range of every slot of layers [layer_begin, layer_end), appended to *ranges.
  void CollectRanges(int layer_begin, int layer_end,
                     std::vector<PageAllocator::PageRange>* ranges) const;
  // Checks every page a copy of the sequence reads (image export): its own pages whole and the
  // chunks of the slots it borrows. OK or DATA_LOSS.
  Status VerifyForCopy() const;
  // The byte range of every slot the sequence borrows from its lender, appended to *ranges.
  void CollectBorrowedRanges(std::vector<PageAllocator::PageRange>* ranges) const;
  // Marks the sequence lost (the first loss is kept) and returns the status it answers from now.
  Status MarkLost(const Status& loss);
  // What Materialize writes for the tokens in records: zeros (for callers that never read them),
  // K only (V left as it was: the scorers read keys; RecordValues decodes V where needed), or both.
  enum class RecordRows { kZeros, kKeys, kKeysAndValues };
  // fp32 K and V rows of logical tokens [from, count + new) of one head into out_k / out_v
  // (room for that many rows of head_dim each): sinks, records, tail, then the new tokens
  // (rounded to fp16 unless the layer is lossless); the records' rows as `records` says.
  void Materialize(const LayerState& layer, int head, int64_t from, const KvTensorView& k,
                   const KvTensorView& v, float* out_k, float* out_v, RecordRows records) const;
  // Rows of a head a fork borrows from its frozen prefix (kv_sequence_fork.cc).
  static size_t SharedRows(const LayerState& layer, const HeadStream& head);
  // Tokens a head's tail holds after an append of n tokens without eviction (inline in
  // kv_sequence_internal.h): AppendIsLight and PlanHeadRows share this rule.
  static int64_t TailAfterAppend(const HeadStream& head, int sink_target, int64_t n);
  // Prepare, step by step (kv_sequence_evict.cc; the driver in kv_sequence_append.cc): the budgets
  // of the layer's heads, the H2O fold, the online head re-allocation, one head's eviction, its
  // record plan, its rows.
  struct LayerPrep;
  // Before a prepare first reads stored slots of the layer to write what it read again (decoded
  // and re-packed, moved by their bytes): checks the chunks of every head's slots once
  // (PageAllocator::VerifyReason::kRewrite), since a checksum taken over bytes changed behind
  // the daemon's back would launder the change. A mismatch is kept in p.loss, which
  // AppendLayerPrepare returns.
  void CheckLayerSlots(LayerPrep& p) const;
  KeyRows FullKeys(LayerPrep& p, int h) const;
  // R-KV on a head that holds no record yet (its first compression, usually the prefill's) of a
  // token-separable quantized layer: p.stored_k[h] gets the keys its rows will hold once
  // quantized, so the redundancy state carries over to the next scoring (kv_sequence_evict.cc).
  void KeysAsStored(LayerPrep& p, int h) const;
  // The V rows (in p.all_v) of the records holding tokens[begin, end) (token indices), where
  // FullKeys decoded only K: what a re-pack or the new tail reads of partly evicted records.
  void RecordValues(LayerPrep& p, int h, const std::vector<int64_t>& tokens, size_t begin,
                    size_t end) const;
  // FullKeys without decoding the records: for an eviction that keeps or drops whole records.
  void RowsPastRecords(LayerPrep& p, int h) const;
  // Streaming: the target EvictHead keeps, lowered to a whole-record boundary when that drops
  // whole records instead of re-packing them (evict.whole_records).
  int64_t WholeRecordTarget(const LayerPrep& p, int h, int64_t total, int64_t target,
                            int64_t protect) const;
  StatusOr<KvTensorView> RecentQueries(const LayerPrep& p, int64_t rows, int h) const;
  const H2OState* H2OOf(const LayerPrep& p, int h) const;
  // rkv: the head's redundancy state for this append (the prepared copy); nullptr otherwise.
  RedundancyState* RedundancyOf(LayerPrep& p, int h) const;
  Status PlanHeadBudgets(LayerPrep& p) const;
  // How many of layer l's heads evict.full_heads names (EvictionSettings::full_head).
  int FullHeadsOf(int l) const;
  // Whether evict.full_heads names (layer l, head h).
  bool IsFullHead(int l, int h) const;
  Status FoldH2O(LayerPrep& p) const;
  Status ReallocateHeads(LayerPrep& p) const;
  // Whether head h evicts in this append: over its budget, or (evict.stagger_layers) its layer's
  // scheduled step with more than its compressed size.
  bool Compresses(const LayerPrep& p, int h) const;
  Status EvictHead(LayerPrep& p, int h, std::vector<uint8_t>* keep) const;
  void PlanHeadRecords(LayerPrep& p, int h, const std::vector<uint8_t>& keep,
                       std::vector<int64_t>* loose) const;
  void PlanHeadRows(LayerPrep& p, int h, const std::vector<uint8_t>& keep,
                    std::vector<int64_t>* loose) const;
  // Whether head h of layer l, evicting nothing, flushes its tail in this append (PlanHeadRows).
  bool FlushesTail(const AppendContext& ctx, int l, int h) const;
  // Before layers [layer_begin, layer_end) are prepared: checks (PageAllocator kRewrite) the fp16
  // tail rows their flushes will read and quantize, so a change made behind the daemon's back is
  // found (DATA_LOSS) instead of encoded into a record with a fresh checksum. A head that evicts
  // has all of its slots checked when they are decoded (CheckLayerSlots).
  Status CheckFlushedTails(const AppendContext& ctx, int layer_begin, int layer_end) const;
  // PlanHeadRows' flush of a head that evicts nothing: its stored fp16 rows from read_from on and
  // the new ones, without an fp32 copy.
  void FlushStoredRows(LayerPrep& p, int h, int64_t read_from) const;
  // Prepare's last step: encodes every head's flushed rows (out->heads[h].qk/qv) into
  // out->heads[h].records (OScaR: the layer's token norms first) and samples their quality.
  Status EncodeNewRecords(int layer, PreparedLayer* out) const;
  Status AppendLayerPrepare(int layer, const AppendContext& ctx, const KvTensorView& k,
                            const KvTensorView& v, const KvTensorView* q, PreparedLayer* out) const;
  // AppendLayerPrepare of every layer into prepared_, through prepare_runner_ when the append
  // works over prepare_split_tokens_ tokens or more (SetPrepareRunner); the first failure in layer
  // order is returned (DATA_LOSS marks the sequence lost), as the layer-by-layer loop would.
  Status PrepareLayers(const AppendContext& ctx, int64_t n, const std::vector<KvTensorView>& k,
                       const std::vector<KvTensorView>& v, const std::vector<KvTensorView>* q);

  PageAllocator* pool_;
  SequenceGeometry geometry_;
  // Fork: the frozen sequence whose slots the streams borrow, kept alive (and its pages held)
  // while this sequence may read them. Declared first, so it goes last.
  std::shared_ptr<const KvSequence> lender_;
  // The pages every stream's slots live in, one slab per slot size. Declared before layers_ so
  // the streams give their slots back before the slabs return the pages.
  SlabSet slabs_;
  std::vector<std::unique_ptr<LayerState>> layers_;
  EvictionSettings eviction_;
  PressureSettings pressure_;
  uint64_t pressure_reliefs_ = 0;
  uint64_t pressure_cap_cuts_ = 0;
  uint64_t lowered_for_others_ = 0;
  int64_t last_shortfall_pages_ = 0;
  int64_t tokens_ = 0;
  int64_t first_position_ = 0;
  int64_t since_realloc_ = 0;    // Tokens appended since the last head re-allocation.
  int64_t deferred_tokens_ = 0;  // Stored by deferred appends since the last eviction.
  uint64_t deferred_appends_ = 0;
  uint64_t deferral_cap_hits_ = 0;
  Status integrity_;         // DATA_LOSS once a page checksum mismatched.
  size_t scrub_cursor_ = 0;  // Index into slabs_.CollectPages where Scrub goes on.
  // A device copy failed: the next Publish visits every held page, whose marks stayed.
  bool publish_all_ = false;
  // Per layer: the state in which Verify last found every chunk of the layer's slots verified
  // (pool.verify_on_fetch = "unverified" only). Equal to the current state: nothing to check.
  struct VerifiedStamp {
    uint64_t writes = UINT64_MAX;  // slabs_.writes(); UINT64_MAX: never verified.
    uint64_t failures = 0;         // pool_->checksum_failures().
    bool operator==(const VerifiedStamp&) const = default;
  };
  std::vector<VerifiedStamp> layer_verified_;
  std::vector<PreparedLayer> prepared_;  // The stages' plan, kept for its buffers' capacity.
  const PartsRunner* prepare_runner_ = nullptr;  // SetPrepareRunner.
  int64_t prepare_split_tokens_ = 0;
  // flush_after_reply: a quantized layer's tail holds flush_tokens rows or more (no eviction).
  bool HeldFlushDue() const;
  // Commits a held flush that PrepareHeldFlushStep prepared completely for the current state;
  // drops it otherwise, or when the pool cannot give its pages (the stages then flush, with
  // pressure relief). Fails only with DATA_LOSS.
  Status CommitPreparedFlush();
  struct HeldFlushPrep;  // kv_sequence_internal.h.
  std::unique_ptr<HeldFlushPrep> held_prep_;
  uint64_t publishes_ = 0;  // Publish calls: every public method that writes makes one.
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SEQUENCE_KV_SEQUENCE_H_
