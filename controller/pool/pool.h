// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/pool/pool.h
// The KV pool: one Arena of pool.bytes (POSIX shared memory on a CPU node, so engines map it and
// the hot path moves no tensor bytes through the socket) and a PageAllocator that hands out
// fixed-size pages with O(1) allocate/free and exact accounting, and keeps a CRC32C of every
// page's written bytes in its own memory (page checksums, below). The tail of a device arena is
// carved into per-session staging slots, so pages + staging never exceed pool.bytes; a cpu pool's
// staging slots are separate objects (controller/pool/staging_shm.h).
//
// Thread safety: Arena and ShmArena are immutable after Create (the memory they map is not
// synchronized: page owners are). PageAllocator is internally synchronized; every method may be
// called from any thread.
//
//   KVCTL_ASSIGN_OR_RETURN(auto arena, ShmArena::Create("/kvctl-pool", 256 << 20));
//   KVCTL_ASSIGN_OR_RETURN(auto pool, PageAllocator::Create(std::move(arena), {.page_bytes =
//   65536})); KVCTL_ASSIGN_OR_RETURN(uint32_t page, pool->Allocate());  // pool->PagePointer(page)
//   ...
#ifndef KVCTL_CONTROLLER_POOL_POOL_H_
#define KVCTL_CONTROLLER_POOL_POOL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "kernels/quantize.h"

namespace kvctl {

// [offset, offset + bytes) of an arena.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Memory the pool is carved from. base() is the memory the daemon reads and writes. A device
// arena (controller/pool/cuda_arena.h) is *mirrored*: base() is a host copy the daemon works on,
// the copy engines read lives in device memory, Publish makes ranges of the device copy equal to
// the host copy and Pull copies a range the other way (staging slots that engines fill on the
// device). Records are encoded where the arena lives (EncodeBlocks: the CPU here, the device
// there).
class Arena {
 public:
  virtual ~Arena() = default;
  virtual uint8_t* base() const = 0;
  virtual uint64_t bytes() const = 0;

  virtual bool mirrored() const { return false; }
  // Mirrored arenas only; REQUIRES: every range inside bytes(), ranges sorted and disjoint.
  // Publish has returned only when the device copy holds the bytes. Errors name the device call.
  virtual Status Publish(const std::vector<ByteRange>& /*ranges*/) { return OkStatus(); }
  virtual Status Pull(uint64_t /*offset*/, uint64_t /*bytes*/) { return OkStatus(); }
  // Quantizes batch.n_blocks blocks of one head into records, record_bytes apart; the contract of
  // kernels/quantize.h QuantizeBlocks (which is what the CPU arenas run). Thread-safe.
  virtual Status EncodeBlocks(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records);
  // Where engines find a device arena: its CUDA ordinal and cudaIpcMemHandle_t bytes (64).
  // -1 and "" for host memory.
  virtual int cuda_device() const { return -1; }
  virtual std::string cuda_ipc_handle() const { return {}; }
};

// OK if `name` is a POSIX shm name: '/' then 1..254 characters, none of them '/'.
Status ValidateShmName(std::string_view name);

// What ShmArena::Create does when the name already exists and no live daemon holds it.
enum class StaleShm { kRefuse, kUnlink };

// A POSIX shared-memory object /dev/shm/<name>, mode 0600, mapped read/write. The creator holds
// an exclusive flock on it for its lifetime, which is how a later Create tells a running daemon's
// object from one left by a crash.
class ShmArena final : public Arena {
 public:
  // Creates and maps a new object of `bytes` bytes, reserving its memory up front (so a too-small
  // /dev/shm fails here with RESOURCE_EXHAUSTED instead of SIGBUS later). If `name` exists:
  // ALREADY_EXISTS if a running daemon holds it (never touched); an object no one holds (left by a
  // daemon that died) is removed and creation retried, or with StaleShm::kRefuse reported as
  // ALREADY_EXISTS. INVALID_ARGUMENT for a bad name or 0 bytes.
  static StatusOr<std::unique_ptr<ShmArena>> Create(const std::string& name, uint64_t bytes,
                                                    StaleShm stale = StaleShm::kUnlink);
  // Unmaps, and unlinks the name if it still refers to this object. Engines that mapped it keep
  // their mapping until they unmap.
  ~ShmArena() override;
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  uint8_t* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  const std::string& name() const { return name_; }
  // Makes the object read-only (mode 0400) for every later open: engines map the pool
  // PROT_READ, and one that asks for write access (O_RDWR) is refused unless it runs as root or
  // changes the mode back. Our own mapping stays writable. Internal error naming the call.
  Status RestrictToReaders();

 private:
  ShmArena(std::string name, int fd, uint8_t* base, uint64_t bytes);

  const std::string name_;
  const int fd_;  // Kept open: it carries the flock.
  uint8_t* const base_;
  const uint64_t bytes_;
};

struct PageAllocatorOptions {
  uint64_t page_bytes = 64 << 10;   // Power of two, >= 4KiB.
  uint32_t staging_slots = 0;       // 0 or staging_slot_bytes 0: no staging.
  uint64_t staging_slot_bytes = 0;  // Capacity of one slot; its stride is rounded up to 4KiB.
  // Keep a CRC32C of every page in daemon memory (see "Page checksums" below). Ignored for
  // mirrored arenas: the host copy they work on is private to the daemon already.
  bool checksums = false;
  // What a FETCH verifies (pool.verify_on_fetch): every sealed chunk it reads or refers to
  // (kAll), or only those not verified since they were last written (kUnverified).
  enum class FetchVerify : uint8_t { kAll, kUnverified };
  FetchVerify fetch_verify = FetchVerify::kAll;
};

// A staging slot: [offset, offset + bytes) of the arena, owned by one session.
struct StagingSlot {
  uint32_t id = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;  // The slot's capacity (>= the bytes requested).
};

// Pages only, unless the name says staging. bytes_used + bytes_free == pages_total * page_bytes.
struct PoolStats {
  uint64_t arena_bytes = 0;
  uint64_t page_bytes = 0;
  uint32_t pages_total = 0;
  uint32_t pages_used = 0;
  uint32_t pages_high_water = 0;  // Most pages ever in use at once.
  uint64_t bytes_used = 0;
  uint64_t bytes_free = 0;
  uint64_t bytes_high_water = 0;
  uint32_t staging_slots_total = 0;
  uint32_t staging_slots_used = 0;
  uint64_t staging_slot_bytes = 0;
  uint64_t staging_bytes_total = 0;  // Slot strides included: the arena bytes staging takes.
  uint64_t alloc_failures_total = 0;
  // Mirrored arenas: changed byte ranges copied to the device, and their bytes.
  uint64_t publish_ranges_total = 0;
  uint64_t publish_bytes_total = 0;
  // Page checksums: pages found changed behind the daemon's back, and bytes the scrubber and
  // FETCH verified.
  uint64_t checksum_failures_total = 0;
  uint64_t scrubbed_bytes_total = 0;
  uint64_t verified_bytes_total = 0;
  uint64_t sealed_bytes_total = 0;  // Bytes checksummed to seal what requests wrote.
};

// Fixed-size pages [0, pages_total) at the start of the arena, staging slots at its end.
class PageAllocator {
 public:
  using FetchVerify = PageAllocatorOptions::FetchVerify;
  // INVALID_ARGUMENT if page_bytes is not a power of two >= 4KiB, or if staging leaves no page.
  static StatusOr<std::unique_ptr<PageAllocator>> Create(std::unique_ptr<Arena> arena,
                                                         const PageAllocatorOptions& options);

  // One free page, lowest ids first on a fresh pool. RESOURCE_EXHAUSTED naming the requested
  // and free bytes when none is left.
  StatusOr<uint32_t> Allocate() KVCTL_EXCLUDES(mu_);
  // `count` pages, all or nothing (a prefill never holds a partial set).
  StatusOr<std::vector<uint32_t>> AllocateMany(uint32_t count) KVCTL_EXCLUDES(mu_);
  // FAILED_PRECONDITION for a page that is not allocated or out of range; nothing changes then.
  Status Free(uint32_t page) KVCTL_EXCLUDES(mu_);
  bool IsAllocated(uint32_t page) const KVCTL_EXCLUDES(mu_);

  // A free staging slot for a session that needs `bytes` (1..staging_slot_bytes).
  // FAILED_PRECONDITION if staging is disabled, INVALID_ARGUMENT if `bytes` does not fit a slot,
  // RESOURCE_EXHAUSTED if every slot is taken.
  StatusOr<StagingSlot> AllocateStaging(uint64_t bytes) KVCTL_EXCLUDES(mu_);
  // FAILED_PRECONDITION for a slot that is not allocated or out of range.
  Status FreeStaging(uint32_t slot_id) KVCTL_EXCLUDES(mu_);

  // Byte offset of a page or slot in the arena (what engines add to their own mapping), and
  // the address in this process. REQUIRES: page < pages_total(), slot_id < staging_slots().
  uint64_t PageOffset(uint32_t page) const;
  uint8_t* PagePointer(uint32_t page) const;
  uint64_t StagingOffset(uint32_t slot_id) const;
  uint8_t* StagingPointer(uint32_t slot_id) const;

  // Mirrored arenas (Arena::mirrored): writers mark the bytes of a page whose host copy they
  // changed (each page keeps one interval covering its marks), and the owner of those pages
  // publishes them before anyone outside may read them (the daemon: before it replies). Both are
  // no-ops for host arenas, except that MarkDirty also feeds the page checksums when they are on.
  // Any thread; a page is marked and published by its owner only, one thread at a time (the
  // owner's lock orders its marks: they are not atomic read-modify-writes).
  // REQUIRES: page < pages_total(), begin < end <= page_bytes().
  bool mirrored() const { return mirrored_; }
  void MarkDirty(uint32_t page, uint32_t begin, uint32_t end);
  // Copies the marked intervals of `pages` to the device copy in one Arena::Publish (adjacent
  // intervals merged) and clears the marks. On a copy error the marks are restored and the error
  // is returned.
  Status PublishPages(const std::vector<uint32_t>& pages);
  // Copies [offset, offset + bytes) of a staging slot from the device copy into base().
  // REQUIRES: the range lies inside one staging slot.
  Status PullStaging(uint64_t offset, uint64_t bytes);

  // Page checksums (PageAllocatorOptions::checksums; docs/reliability.md). A page's bytes
  // [0, sealed_end) are checksummed in chunks of kChecksumChunkBytes (the page for 4 KiB pages),
  // each chunk's CRC32C over its part of that prefix kept in daemon memory; sealed_end is the
  // furthest byte its owner ever wrote since it allocated the page. Chunks make a check cost what
  // it covers: a FETCH of one layer reads the chunks its slots lie in, not the whole pages, which
  // slabs share between layers. Writers mark what they change (MarkDirty, as for mirrored arenas)
  // and the owner seals its pages once per request, before it replies (SealPages: a chunk changed
  // below sealed_end is checksummed again, one only extended past it continues its checksum);
  // VerifyPages and VerifyRanges recompute. A page's owner seals and verifies it (holding
  // whatever serializes its writes), so neither races a write. Free forgets a page's checksums.
  // MarkDirty below a page's sealed_end first verifies the chunks it is about to change, once per
  // request (a checksum over changed bytes would launder a change made behind the daemon's back);
  // SealPages reports such a page as DATA_LOSS (and seals it all the same, so the daemon's own
  // state stays consistent: the caller marks the owner lost).
  static constexpr uint32_t kChecksumChunkBytes = 4096;
  bool checksums() const { return checksums_; }
  Status SealPages(const std::vector<uint32_t>& pages);
  // kCopy: the owner is about to copy bytes of the pages to another place in the middle of a
  // request (a slab compaction, a spill or fork), where they would be sealed afresh. A chunk its
  // owner already rewrote below the sealed end in this request was checked by that write
  // (MarkDirty; a mismatch then is reported by SealPages and marks the owner lost) and is
  // skipped; the others are checked now, their sealed bytes being untouched by the request so far.
  // kRewrite: the owner is about to re-encode what it reads into new slots (a flush of stored
  // fp16 rows into records, an eviction's re-pack or move of kept tokens). As kCopy, and with
  // FetchVerify::kUnverified chunks verified since written are skipped (and a chunk it checks
  // counts as verified, as after a FETCH), the trust a FETCH gives them: a change made after that
  // check is found by the scrubber, or by the next write to the chunk (MarkDirty checks it first),
  // either of which marks the owner lost.
  enum class VerifyReason { kFetch, kScrub, kCopy, kRewrite };
  // Verified since written (FetchVerify::kUnverified): every chunk carries a bit, set when a
  // FETCH's (or a kRewrite) check of it passes and cleared by anything that changes what it holds
  // or its checksum (MarkDirty, SealPages, Free) and by a check that finds it changed. A kFetch
  // check skips chunks whose bit is set, so a FETCH costs the chunks written since the last FETCH
  // (or scrub mismatch), not the sequence's length; so does a kRewrite check. kScrub and kCopy
  // always check every chunk they are given: the scrubber is what finds a change made after a chunk
  // was verified, and a copy must not launder one into a fresh checksum. A budget for a kFetch
  // check (the daemon's I/O thread): when the chunks left to check hold more than max_bytes,
  // nothing is checked, exceeded is set and OK returned.
  struct VerifyBudget {
    uint64_t max_bytes = 0;
    bool exceeded = false;
  };
  // OK when every page still holds what was sealed; otherwise DATA_LOSS naming each page that
  // does not (page id, pool offset, expected and found CRC32C of its first bad chunk), and
  // checksum_failures_total counts them. Counts the bytes checksummed (verified_ or
  // scrubbed_bytes_total).
  Status VerifyPages(const std::vector<uint32_t>& pages, VerifyReason reason,
                     VerifyBudget* budget = nullptr) const;
  // [begin, end) of one page.
  struct PageRange {
    uint32_t page = 0;
    uint32_t begin = 0;
    uint32_t end = 0;
  };
  // As VerifyPages, for the sealed chunks the ranges touch (each chunk checked once however many
  // ranges touch it). REQUIRES: every range inside its page, begin < end.
  Status VerifyRanges(const std::vector<PageRange>& ranges, VerifyReason reason,
                      VerifyBudget* budget = nullptr) const;
  // Whether a chunk's bit is set (tests). REQUIRES: page < pages_total(), chunk in the page.
  bool ChunkVerified(uint32_t page, uint32_t chunk) const;
  FetchVerify fetch_verify() const { return fetch_verify_; }
  // Checksum mismatches found so far (PoolStats::checksum_failures_total without the lock). A
  // mismatch is the one event besides its owner's writes that unsets a chunk's verified bit, so
  // an owner may cache "these chunks are verified" against this count and its own writes, read
  // before it checks (a check that found a mismatch clears the bits before it counts it).
  uint64_t checksum_failures() const { return checksum_failures_.load(std::memory_order_acquire); }
  // Bytes VerifyPages reads of `page` (0 without checksums).
  uint64_t SealedBytes(uint32_t page) const;

  Status EncodeBlocks(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records) const {
    return arena_->EncodeBlocks(spec, batch, records);
  }

  PoolStats Stats() const KVCTL_EXCLUDES(mu_);
  uint64_t page_bytes() const { return page_bytes_; }
  uint32_t pages_total() const { return pages_total_; }
  uint32_t staging_slots() const { return staging_slots_; }
  const Arena& arena() const { return *arena_; }

 private:
  PageAllocator(std::unique_ptr<Arena> arena, uint64_t page_bytes, uint32_t pages_total,
                uint32_t staging_slots, uint64_t staging_slot_bytes, uint64_t staging_stride,
                bool checksums, FetchVerify fetch_verify);
  bool tracks_writes() const { return mirrored_ || checksums_; }
  // Checksum helpers (checksummed arenas). The CRC32C of chunk `chunk`'s bytes below `sealed`.
  uint32_t ChunkCrc(uint32_t page, uint32_t chunk, uint32_t sealed) const;
  // Whether the chunk still holds what was sealed; adds the bytes read to *bytes.
  bool ChunkIntact(uint32_t page, uint32_t chunk, uint32_t sealed, uint64_t* bytes) const;
  // Widens the page's verified chunks to cover [lo, hi), checking the newly covered sealed ones
  // (a mismatch taints the page).
  void CoverVerified(uint32_t page, uint32_t lo, uint32_t hi, uint32_t sealed);
  // VerifyPages/VerifyRanges: whether a (page, chunk) key (page * chunks_per_page_ + chunk) is
  // left out of a check for `reason` (its bit set and reason a kFetch that skips those).
  bool SkipVerified(uint64_t key, VerifyReason reason) const;
  // Clears the bits of chunks [lo, hi) of a page.
  void ClearVerified(uint32_t page, uint32_t lo, uint32_t hi);
  // Checks the keys (grouped by page, each once) and reports the pages found changed.
  Status VerifyChunks(const std::vector<uint64_t>& keys, VerifyReason reason,
                      VerifyBudget* budget) const;
  Status ExhaustedLocked(uint32_t count) KVCTL_REQUIRES(mu_);

  // Constant after construction.
  const std::unique_ptr<Arena> arena_;
  const uint64_t page_bytes_;
  const uint32_t pages_total_;
  const uint32_t staging_slots_;
  const uint64_t staging_slot_bytes_;
  const uint64_t staging_stride_;
  const uint64_t staging_offset_;
  const bool mirrored_;
  const bool checksums_;  // Never together with mirrored_: the two share the dirty marks.
  const FetchVerify fetch_verify_;
  // Per page (mirrored or checksummed arenas): the marked interval [dirty_begin_, dirty_end_) of
  // its bytes, empty (page_bytes, 0) when clean. Atomic because a page changes owner when freed.
  const std::unique_ptr<std::atomic<uint32_t>[]> dirty_begin_;
  const std::unique_ptr<std::atomic<uint32_t>[]> dirty_end_;
  std::atomic<uint64_t> publish_ranges_{0};
  std::atomic<uint64_t> publish_bytes_{0};
  // Checksummed arenas: per chunk (page * chunks_per_page_ + index), the CRC32C of its part of
  // [0, sealed_end_); per page, sealed_end_, and the chunks [verified_lo_, verified_hi_) checked
  // by MarkDirty since the last seal (empty: lo >= hi). Atomic for the same reason.
  const uint32_t chunks_per_page_;
  const std::unique_ptr<std::atomic<uint32_t>[]> chunk_crc_;
  const std::unique_ptr<std::atomic<uint32_t>[]> sealed_end_;
  const std::unique_ptr<std::atomic<uint32_t>[]> verified_lo_;
  const std::unique_ptr<std::atomic<uint32_t>[]> verified_hi_;
  // Per chunk (same index as chunk_crc_): kVerifiedBit when a FETCH verified it since it was
  // last written (see VerifyReason), and a generation in the other 7 bits that every clear bumps,
  // so that a FETCH whose check began before a clear (another sequence's FETCH of a cached
  // prefix's chunk, racing the scrubber that found it changed) does not set the bit after it.
  // A const check sets it: the bit is bookkeeping, not pool state.
  static constexpr uint8_t kVerifiedBit = 1;
  static constexpr uint8_t kGenerationStep = 2;
  const std::unique_ptr<std::atomic<uint8_t>[]> chunk_verified_;
  // Per page: the check before a rewrite (MarkDirty) found a mismatch; reported by SealPages.
  const std::unique_ptr<std::atomic<uint8_t>[]> tainted_;
  mutable std::atomic<uint64_t> checksum_failures_{0};
  mutable std::atomic<uint64_t> scrubbed_bytes_{0};
  mutable std::atomic<uint64_t> verified_bytes_{0};
  std::atomic<uint64_t> sealed_bytes_{0};

  mutable Mutex mu_;
  // Invariant: free_pages_ holds exactly the ids with page_used_[id] == 0, each once.
  std::vector<uint32_t> free_pages_ KVCTL_GUARDED_BY(mu_);  // A stack: O(1) both ways.
  std::vector<uint8_t> page_used_ KVCTL_GUARDED_BY(mu_);
  uint32_t pages_high_water_ KVCTL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> free_slots_ KVCTL_GUARDED_BY(mu_);
  std::vector<uint8_t> slot_used_ KVCTL_GUARDED_BY(mu_);
  uint64_t alloc_failures_ KVCTL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_POOL_POOL_H_
