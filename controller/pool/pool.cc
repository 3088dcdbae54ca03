// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/pool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/checked_math.h"
#include "common/crc32c.h"

namespace kvctl {
namespace {

constexpr uint64_t kStagingAlign = 4096;  // Slots start on OS page boundaries.

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string ErrnoText(int err) { return std::strerror(err); }

// Opens an existing object without creating it and probes its flock. Returns true if no process
// holds it (a leftover of a crash), false if a live daemon does; errors if it cannot be opened.
StatusOr<bool> ProbeStale(const std::string& name) {
  // Read-only: a live daemon's pool is mode 0400 (ShmArena::RestrictToReaders); flock needs no
  // write access.
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return true;  // Vanished meanwhile: as good as stale.
    return AlreadyExists("pool.shm_name: ", name, " already exists and cannot be opened (",
                         ErrnoText(err), "); it belongs to another user or daemon");
  }
  const bool stale = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);  // Releases the probe's lock, if it got one.
  return stale;
}

// Whether `name` still refers to the object open as `fd` (another process may have removed it
// as stale and created its own under the same name).
bool NameIsOurs(const std::string& name, int fd) {
  const int named_fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (named_fd < 0) return false;
  struct stat mine {
  }, named{};
  const bool ours = fstat(fd, &mine) == 0 && fstat(named_fd, &named) == 0 &&
                    mine.st_dev == named.st_dev && mine.st_ino == named.st_ino;
  close(named_fd);
  return ours;
}

void UnlinkIfOurs(const std::string& name, int fd) {
  if (NameIsOurs(name, fd)) shm_unlink(name.c_str());
}

}  // namespace

Status ValidateShmName(std::string_view name) {
  if (name.size() < 2 || name.size() > 255 || name.front() != '/' ||
      name.find('/', 1) != std::string_view::npos || name == "/." || name == "/..") {
    return InvalidArgument("shm name: got \"", name,
                           "\", expected '/' then 1..254 characters, none of them '/'");
  }
  return OkStatus();
}

// ---- ShmArena ---------------------------------------------------------------------------------

ShmArena::ShmArena(std::string name, int fd, uint8_t* base, uint64_t bytes)
    : name_(std::move(name)), fd_(fd), base_(base), bytes_(bytes) {}

StatusOr<std::unique_ptr<ShmArena>> ShmArena::Create(const std::string& name, uint64_t bytes,
                                                     StaleShm stale) {
  KVCTL_RETURN_IF_ERROR(ValidateShmName(name));
  if (bytes == 0) return InvalidArgument("pool.bytes: got 0, expected at least 1 byte");

  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    KVCTL_ASSIGN_OR_RETURN(const bool is_stale, ProbeStale(name));
    if (!is_stale) {
      return AlreadyExists("pool.shm_name: ", name, " (/dev/shm", name,
                           ") is in use by a running kvctl daemon (it holds the object's lock); "
                           "stop it or choose another pool.shm_name");
    }
    // No process holds the object's lock, and every daemon holds it for the pool's life: the
    // object is a dead daemon's leftover (kill -9, a crash). Removed by default so the same
    // start command works again; pool.unlink_stale = false keeps it for inspection.
    if (stale == StaleShm::kRefuse) {
      return AlreadyExists("pool.shm_name: ", name, " (/dev/shm", name,
                           ") already exists but no process holds it: left by a daemon that "
                           "died. pool.unlink_stale = false keeps such objects; remove it (rm "
                           "/dev/shm",
                           name, ") or set pool.unlink_stale = true (the default)");
    }
    if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
      return Internal("pool.shm_name: cannot remove stale ", name, ": ", ErrnoText(errno));
    }
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return AlreadyExists("pool.shm_name: ", name, " was created by another process meanwhile");
    }
    return Unavailable("pool.shm_name: shm_open(", name, ") failed: ", ErrnoText(err));
  }

  // From here on a failure must not leave the object behind, nor remove one that replaced it.
  const auto fail = [&](Status s) {
    UnlinkIfOurs(name, fd);
    close(fd);
    return s;
  };
  // The umask may have narrowed the mode; it must be exactly owner read/write.
  if (fchmod(fd, 0600) != 0) {
    return fail(Internal("pool.shm_name: fchmod(", name, ", 0600): ", ErrnoText(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    return fail(AlreadyExists("pool.shm_name: ", name, " was locked by another process meanwhile"));
  }
  // Between O_EXCL and the lock, a daemon starting at the same moment saw an unlocked object
  // and may have removed it as stale: then the name is that daemon's now, and this one yields.
  if (!NameIsOurs(name, fd)) {
    close(fd);
    return AlreadyExists("pool.shm_name: ", name,
                         " was taken over by another daemon starting at the same time");
  }
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    return fail(ResourceExhausted("pool.bytes: cannot reserve ", bytes, " bytes in /dev/shm for ",
                                  name, ": ", ErrnoText(err),
                                  "; lower pool.bytes or enlarge /dev/shm (docker: --shm-size)"));
  }
  // MAP_POPULATE: the pages fallocate reserved are mapped now, once, rather than one minor fault
  // per 4 KiB on the request that first writes them (a flush's new record pages spent more in
  // faults than in the copies).
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    return fail(
        ResourceExhausted("pool.bytes: mmap of ", bytes, " bytes failed: ", ErrnoText(errno)));
  }
  return std::unique_ptr<ShmArena>(new ShmArena(name, fd, static_cast<uint8_t*>(base), bytes));
}

Status ShmArena::RestrictToReaders() {
  if (fchmod(fd_, 0400) != 0) {
    return Internal("pool.shm_name: fchmod(", name_, ", 0400): ", ErrnoText(errno));
  }
  return OkStatus();
}

ShmArena::~ShmArena() {
  munmap(base_, bytes_);
  // Unlink only our own object: if the name was replaced (another daemon removed ours as stale),
  // the new object is not ours to remove.
  UnlinkIfOurs(name_, fd_);
  close(fd_);
}

// ---- PageAllocator ----------------------------------------------------------------------------

PageAllocator::PageAllocator(std::unique_ptr<Arena> arena, uint64_t page_bytes,
                             uint32_t pages_total, uint32_t staging_slots,
                             uint64_t staging_slot_bytes, uint64_t staging_stride, bool checksums,
                             FetchVerify fetch_verify)
    : arena_(std::move(arena)),
      page_bytes_(page_bytes),
      pages_total_(pages_total),
      staging_slots_(staging_slots),
      staging_slot_bytes_(staging_slot_bytes),
      staging_stride_(staging_stride),
      staging_offset_(arena_->bytes() - staging_stride * staging_slots),
      mirrored_(arena_->mirrored()),
      checksums_(checksums && !mirrored_),
      fetch_verify_(fetch_verify),
      dirty_begin_(tracks_writes() ? new std::atomic<uint32_t>[pages_total] : nullptr),
      dirty_end_(tracks_writes() ? new std::atomic<uint32_t>[pages_total] : nullptr),
      chunks_per_page_(static_cast<uint32_t>(page_bytes / kChecksumChunkBytes)),
      chunk_crc_(checksums_ ? new std::atomic<uint32_t>[uint64_t{pages_total} * chunks_per_page_]
                            : nullptr),
      sealed_end_(checksums_ ? new std::atomic<uint32_t>[pages_total] : nullptr),
      verified_lo_(checksums_ ? new std::atomic<uint32_t>[pages_total] : nullptr),
      verified_hi_(checksums_ ? new std::atomic<uint32_t>[pages_total] : nullptr),
      chunk_verified_(checksums_
                          ? new std::atomic<uint8_t>[uint64_t{pages_total} * chunks_per_page_]
                          : nullptr),
      tainted_(checksums_ ? new std::atomic<uint8_t>[pages_total] : nullptr),
      page_used_(pages_total, 0),
      slot_used_(staging_slots, 0) {
  for (uint32_t i = 0; tracks_writes() && i < pages_total; ++i) {
    dirty_begin_[i].store(static_cast<uint32_t>(page_bytes), std::memory_order_relaxed);
    dirty_end_[i].store(0, std::memory_order_relaxed);
  }
  for (uint64_t i = 0; checksums_ && i < uint64_t{pages_total} * chunks_per_page_; ++i) {
    chunk_crc_[i].store(0, std::memory_order_relaxed);
    chunk_verified_[i].store(0, std::memory_order_relaxed);
  }
  for (uint32_t i = 0; checksums_ && i < pages_total; ++i) {
    sealed_end_[i].store(0, std::memory_order_relaxed);
    verified_lo_[i].store(chunks_per_page_, std::memory_order_relaxed);
    verified_hi_[i].store(0, std::memory_order_relaxed);
    tainted_[i].store(0, std::memory_order_relaxed);
  }
  // Stacks pop from the back: push in reverse so a fresh pool hands out ids 0, 1, 2, ...
  free_pages_.reserve(pages_total);
  for (uint32_t i = pages_total; i > 0; --i) free_pages_.push_back(i - 1);
  free_slots_.reserve(staging_slots);
  for (uint32_t i = staging_slots; i > 0; --i) free_slots_.push_back(i - 1);
}

StatusOr<std::unique_ptr<PageAllocator>> PageAllocator::Create(std::unique_ptr<Arena> arena,
                                                               const PageAllocatorOptions& o) {
  if (arena == nullptr) return InvalidArgument("pool: arena is null");
  const uint64_t p = o.page_bytes;
  if (p < 4096 || (p & (p - 1)) != 0) {
    return InvalidArgument("pool.page_bytes: got ", p, ", expected a power of two >= 4096");
  }
  const bool staging = o.staging_slots > 0 && o.staging_slot_bytes > 0;
  const uint32_t slots = staging ? o.staging_slots : 0;
  const uint64_t stride = staging ? AlignUp(o.staging_slot_bytes, kStagingAlign) : 0;
  const uint64_t total = arena->bytes();
  if (staging && (stride > total || slots > total / stride)) {
    return InvalidArgument("pool.staging_slots: ", slots, " slots of ", o.staging_slot_bytes,
                           " bytes do not fit in the pool's ", total, " bytes");
  }
  const uint64_t pages = (total - stride * slots) / p;
  if (pages == 0) {
    return InvalidArgument("pool.bytes: got ", total,
                           " bytes, expected room for at least one page of ", p, " bytes besides ",
                           stride * slots, " bytes of staging");
  }
  if (pages > UINT32_MAX) {
    return InvalidArgument("pool.page_bytes: got ", p, ", expected at most 2^32 - 1 pages in ",
                           total, " bytes");
  }
  return std::unique_ptr<PageAllocator>(
      new PageAllocator(std::move(arena), p, static_cast<uint32_t>(pages), slots,
                        staging ? o.staging_slot_bytes : 0, stride, o.checksums, o.fetch_verify));
}

Status PageAllocator::ExhaustedLocked(uint32_t count) {
  ++alloc_failures_;
  return ResourceExhausted(
      "pool: requested ", uint64_t{count} * page_bytes_, " bytes (", count,
      count == 1 ? " page" : " pages", "), free ", uint64_t{free_pages_.size()} * page_bytes_,
      " bytes (", free_pages_.size(), " of ", pages_total_, " pages of ", page_bytes_, " bytes)");
}

StatusOr<uint32_t> PageAllocator::Allocate() {
  MutexLock lock(&mu_);
  if (free_pages_.empty()) return ExhaustedLocked(1);
  const uint32_t page = free_pages_.back();
  free_pages_.pop_back();
  KVCTL_CHECK(page_used_[page] == 0);
  page_used_[page] = 1;
  const uint32_t used = pages_total_ - static_cast<uint32_t>(free_pages_.size());
  if (used > pages_high_water_) pages_high_water_ = used;
  return page;
}

StatusOr<std::vector<uint32_t>> PageAllocator::AllocateMany(uint32_t count) {
  MutexLock lock(&mu_);
  if (count > free_pages_.size()) return ExhaustedLocked(count);
  std::vector<uint32_t> pages(free_pages_.end() - count, free_pages_.end());
  free_pages_.resize(free_pages_.size() - count);
  for (uint32_t page : pages) {
    KVCTL_CHECK(page_used_[page] == 0);
    page_used_[page] = 1;
  }
  const uint32_t used = pages_total_ - static_cast<uint32_t>(free_pages_.size());
  if (used > pages_high_water_) pages_high_water_ = used;
  return pages;
}

Status PageAllocator::Free(uint32_t page) {
  MutexLock lock(&mu_);
  if (page >= pages_total_) {
    return FailedPrecondition("pool: free of page ", page, ", expected a page id below ",
                              pages_total_);
  }
  if (page_used_[page] == 0) {
    return FailedPrecondition("pool: free of page ", page,
                              ", which is not allocated (double free?)");
  }
  page_used_[page] = 0;
  if (checksums_) {
    // The next owner starts with nothing sealed (and no marks of this one).
    dirty_begin_[page].store(static_cast<uint32_t>(page_bytes_), std::memory_order_relaxed);
    dirty_end_[page].store(0, std::memory_order_relaxed);
    sealed_end_[page].store(0, std::memory_order_relaxed);
    verified_lo_[page].store(chunks_per_page_, std::memory_order_relaxed);
    verified_hi_[page].store(0, std::memory_order_relaxed);
    tainted_[page].store(0, std::memory_order_relaxed);
    ClearVerified(page, 0, chunks_per_page_);
  }
  free_pages_.push_back(page);
  return OkStatus();
}

bool PageAllocator::IsAllocated(uint32_t page) const {
  MutexLock lock(&mu_);
  return page < pages_total_ && page_used_[page] != 0;
}

StatusOr<StagingSlot> PageAllocator::AllocateStaging(uint64_t bytes) {
  if (staging_slots_ == 0) {
    return FailedPrecondition(
        "staging: disabled (pool.staging_slots or "
        "pool.staging_bytes_per_session is 0); send K/V inline");
  }
  if (bytes == 0 || bytes > staging_slot_bytes_) {
    return InvalidArgument("staging: requested ", bytes, " bytes, expected 1..",
                           staging_slot_bytes_, " (pool.staging_bytes_per_session)");
  }
  MutexLock lock(&mu_);
  if (free_slots_.empty()) {
    ++alloc_failures_;
    return ResourceExhausted("staging: requested ", bytes, " bytes, but all ", staging_slots_,
                             " slots of ", staging_slot_bytes_, " bytes are in use");
  }
  const uint32_t id = free_slots_.back();
  free_slots_.pop_back();
  KVCTL_CHECK(slot_used_[id] == 0);
  slot_used_[id] = 1;
  return StagingSlot{id, StagingOffset(id), staging_slot_bytes_};
}

Status PageAllocator::FreeStaging(uint32_t slot_id) {
  MutexLock lock(&mu_);
  if (slot_id >= staging_slots_) {
    return FailedPrecondition("staging: free of slot ", slot_id, ", expected a slot id below ",
                              staging_slots_);
  }
  if (slot_used_[slot_id] == 0) {
    return FailedPrecondition("staging: free of slot ", slot_id,
                              ", which is not allocated (double free?)");
  }
  slot_used_[slot_id] = 0;
  free_slots_.push_back(slot_id);
  return OkStatus();
}

uint64_t PageAllocator::PageOffset(uint32_t page) const {
  KVCTL_CHECK(page < pages_total_);
  return uint64_t{page} * page_bytes_;
}

uint8_t* PageAllocator::PagePointer(uint32_t page) const {
  return arena_->base() + PageOffset(page);
}

uint64_t PageAllocator::StagingOffset(uint32_t slot_id) const {
  KVCTL_CHECK(slot_id < staging_slots_);
  return staging_offset_ + uint64_t{slot_id} * staging_stride_;
}

uint8_t* PageAllocator::StagingPointer(uint32_t slot_id) const {
  return arena_->base() + StagingOffset(slot_id);
}

Status Arena::EncodeBlocks(const QuantSpec& spec, const BlockBatch& batch, uint8_t* records) {
  return QuantizeBlocks(spec, batch, records);
}

uint32_t PageAllocator::ChunkCrc(uint32_t page, uint32_t chunk, uint32_t sealed) const {
  const uint32_t begin = chunk * kChecksumChunkBytes;
  const uint32_t end = std::min(begin + kChecksumChunkBytes, sealed);
  return Crc32c(PagePointer(page) + begin, end - begin);
}

bool PageAllocator::ChunkIntact(uint32_t page, uint32_t chunk, uint32_t sealed,
                                uint64_t* bytes) const {
  const uint32_t begin = chunk * kChecksumChunkBytes;
  *bytes += std::min(begin + kChecksumChunkBytes, sealed) - begin;
  return ChunkCrc(page, chunk, sealed) ==
         chunk_crc_[uint64_t{page} * chunks_per_page_ + chunk].load(std::memory_order_relaxed);
}

void PageAllocator::CoverVerified(uint32_t page, uint32_t lo, uint32_t hi, uint32_t sealed) {
  uint32_t old_lo = verified_lo_[page].load(std::memory_order_relaxed);
  uint32_t old_hi = verified_hi_[page].load(std::memory_order_relaxed);
  if (old_lo >= old_hi) old_lo = old_hi = lo;  // Nothing verified yet in this request.
  const uint32_t new_lo = std::min(lo, old_lo), new_hi = std::max(hi, old_hi);
  const uint32_t sealed_chunks = (sealed + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
  uint64_t bytes = 0;
  for (uint32_t c = new_lo; c < new_hi && c < sealed_chunks; ++c) {
    if (c >= old_lo && c < old_hi) continue;  // Checked earlier in this request.
    if (!ChunkIntact(page, c, sealed, &bytes)) tainted_[page].store(1, std::memory_order_relaxed);
  }
  verified_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  verified_lo_[page].store(new_lo, std::memory_order_relaxed);
  verified_hi_[page].store(new_hi, std::memory_order_relaxed);
}

void PageAllocator::MarkDirty(uint32_t page, uint32_t begin, uint32_t end) {
  if (!tracks_writes()) return;
  KVCTL_CHECK(page < pages_total_ && begin < end && end <= page_bytes_);
  if (checksums_) {
    // A write below the sealed end: the chunks it changes still hold what was sealed unless a
    // write of this request changed them already, so check them before they change.
    const uint32_t sealed = sealed_end_[page].load(std::memory_order_relaxed);
    if (begin < sealed) {
      CoverVerified(page, begin / kChecksumChunkBytes,
                    (std::min(end, sealed) + kChecksumChunkBytes - 1) / kChecksumChunkBytes,
                    sealed);
    }
    // What the write changes is no longer what a FETCH verified.
    ClearVerified(page, begin / kChecksumChunkBytes,
                  (end + kChecksumChunkBytes - 1) / kChecksumChunkBytes);
  }
  // Widen the interval. Only the page's owner marks it, holding what serializes its writes, so a
  // load and a store suffice (a locked compare-exchange per written slot cost a decode step about
  // a fifth of its time: it drains the store buffer the slot copies just filled).
  if (begin < dirty_begin_[page].load(std::memory_order_relaxed)) {
    dirty_begin_[page].store(begin, std::memory_order_relaxed);
  }
  if (end > dirty_end_[page].load(std::memory_order_relaxed)) {
    dirty_end_[page].store(end, std::memory_order_relaxed);
  }
}

Status PageAllocator::PublishPages(const std::vector<uint32_t>& pages) {
  if (!mirrored_) return OkStatus();
  std::vector<ByteRange> ranges;
  for (uint32_t page : pages) {
    KVCTL_CHECK(page < pages_total_);
    const uint32_t lo = dirty_begin_[page].exchange(static_cast<uint32_t>(page_bytes_));
    const uint32_t hi = dirty_end_[page].exchange(0);
    if (lo < hi) ranges.push_back({PageOffset(page) + lo, uint64_t{hi} - lo});
  }
  if (ranges.empty()) return OkStatus();
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged{ranges[0]};
  for (size_t i = 1; i < ranges.size(); ++i) {
    ByteRange& last = merged.back();
    if (ranges[i].offset <= last.offset + last.bytes) {
      last.bytes = std::max(last.bytes, ranges[i].offset + ranges[i].bytes - last.offset);
    } else {
      merged.push_back(ranges[i]);
    }
  }
  Status copied = arena_->Publish(merged);
  if (!copied.ok()) {
    for (const ByteRange& r : ranges) {
      const auto page = static_cast<uint32_t>(r.offset / page_bytes_);
      const auto begin = static_cast<uint32_t>(r.offset % page_bytes_);
      MarkDirty(page, begin, static_cast<uint32_t>(begin + r.bytes));
    }
    return copied;
  }
  uint64_t bytes = 0;
  for (const ByteRange& r : merged) bytes += r.bytes;
  publish_ranges_.fetch_add(merged.size(), std::memory_order_relaxed);
  publish_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return OkStatus();
}

Status PageAllocator::SealPages(const std::vector<uint32_t>& pages) {
  if (!checksums_) return OkStatus();
  std::string tainted;
  uint64_t failures = 0;
  for (uint32_t page : pages) {
    KVCTL_CHECK(page < pages_total_);
    if (dirty_end_[page].load(std::memory_order_relaxed) == 0) continue;  // Clean.
    if (tainted_[page].exchange(0, std::memory_order_relaxed) != 0) {
      if (++failures <= 4) {
        tainted += internal::StrCat(tainted.empty() ? "" : ", ", page);
      }
    }
    const uint32_t lo = dirty_begin_[page].exchange(static_cast<uint32_t>(page_bytes_));
    const uint32_t hi = dirty_end_[page].exchange(0);
    const uint32_t sealed = sealed_end_[page].load(std::memory_order_relaxed);
    const uint32_t new_end = std::max(sealed, hi);
    const uint32_t verified_lo = verified_lo_[page].exchange(chunks_per_page_);
    const uint32_t verified_hi = verified_hi_[page].exchange(0);
    const uint8_t* base = PagePointer(page);
    std::atomic<uint32_t>* crcs = &chunk_crc_[uint64_t{page} * chunks_per_page_];
    // Chunks from the first changed byte (or the old sealed end, when the gap before a write
    // past it joins the prefix) to the new sealed end.
    const uint32_t first = std::min(lo, sealed) / kChecksumChunkBytes;
    const uint32_t last = (new_end + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
    for (uint32_t c = first; c < last; ++c) {
      const uint32_t begin = c * kChecksumChunkBytes;
      const uint32_t top = std::min(begin + kChecksumChunkBytes, new_end);
      if ((c >= verified_lo && c < verified_hi) || begin >= sealed) {
        // Checked before this request changed it, or holding nothing sealed: checksum afresh.
        crcs[c].store(Crc32c(base + begin, top - begin), std::memory_order_relaxed);
        sealed_bytes_.fetch_add(top - begin, std::memory_order_relaxed);
        ClearVerified(page, c, c + 1);  // A new checksum: the next FETCH checks it.
      } else if (top > sealed) {
        // Unchanged below the old sealed end (a write there would have checked it): extend.
        crcs[c].store(
            Crc32cExtend(crcs[c].load(std::memory_order_relaxed), base + sealed, top - sealed),
            std::memory_order_relaxed);
        sealed_bytes_.fetch_add(top - sealed, std::memory_order_relaxed);
        ClearVerified(page, c, c + 1);  // New bytes under the checksum: the same.
      }
    }
    sealed_end_[page].store(new_end, std::memory_order_relaxed);
  }
  if (failures == 0) return OkStatus();
  checksum_failures_.fetch_add(failures, std::memory_order_relaxed);
  return DataLoss("pool: ", failures, failures == 1 ? " page" : " pages", " (", tainted,
                  failures > 4 ? ", ..." : "",
                  ") changed outside the daemon; found when a request rewrote them");
}

bool PageAllocator::SkipVerified(uint64_t key, VerifyReason reason) const {
  return (reason == VerifyReason::kFetch || reason == VerifyReason::kRewrite) &&
         fetch_verify_ == FetchVerify::kUnverified &&
         (chunk_verified_[key].load(std::memory_order_relaxed) & kVerifiedBit) != 0;
}

void PageAllocator::ClearVerified(uint32_t page, uint32_t lo, uint32_t hi) {
  // Only the page's owner writes or frees it (holding what serializes its requests), so no check
  // runs on these chunks meanwhile: a plain load and store suffice.
  std::atomic<uint8_t>* bits = &chunk_verified_[uint64_t{page} * chunks_per_page_];
  for (uint32_t c = lo; c < hi && c < chunks_per_page_; ++c) {
    const uint8_t v = bits[c].load(std::memory_order_relaxed);
    bits[c].store(static_cast<uint8_t>((v + kGenerationStep) & ~kVerifiedBit),
                  std::memory_order_relaxed);
  }
}

bool PageAllocator::ChunkVerified(uint32_t page, uint32_t chunk) const {
  KVCTL_CHECK(checksums_ && page < pages_total_ && chunk < chunks_per_page_);
  return (chunk_verified_[uint64_t{page} * chunks_per_page_ + chunk].load(
              std::memory_order_relaxed) &
          kVerifiedBit) != 0;
}

Status PageAllocator::VerifyChunks(const std::vector<uint64_t>& keys, VerifyReason reason,
                                   VerifyBudget* budget) const {
  if (budget != nullptr) {
    uint64_t want = 0;
    for (uint64_t key : keys) {
      const auto page = static_cast<uint32_t>(key / chunks_per_page_);
      const uint32_t begin = static_cast<uint32_t>(key % chunks_per_page_) * kChecksumChunkBytes;
      const uint32_t sealed = sealed_end_[page].load(std::memory_order_relaxed);
      if (begin < sealed) want += std::min(begin + kChecksumChunkBytes, sealed) - begin;
    }
    if (want > budget->max_bytes) {
      budget->exceeded = true;
      return OkStatus();
    }
  }
  std::string bad;
  uint64_t bytes = 0, failures = 0;
  uint32_t last_bad_page = UINT32_MAX;
  for (uint64_t key : keys) {
    const auto page = static_cast<uint32_t>(key / chunks_per_page_);
    const auto chunk = static_cast<uint32_t>(key % chunks_per_page_);
    KVCTL_CHECK(page < pages_total_);
    const uint32_t sealed = sealed_end_[page].load(std::memory_order_relaxed);
    if (chunk * kChecksumChunkBytes >= sealed || page == last_bad_page) continue;
    if ((reason == VerifyReason::kCopy || reason == VerifyReason::kRewrite) &&
        chunk >= verified_lo_[page].load(std::memory_order_relaxed) &&
        chunk < verified_hi_[page].load(std::memory_order_relaxed)) {
      continue;  // Checked by its first write below the seal in this request.
    }
    // Read before the bytes are: a check that finds the chunk changed meanwhile bumps the
    // generation, and the exchange below then leaves the bit clear.
    uint8_t seen = chunk_verified_[key].load(std::memory_order_acquire);
    if (ChunkIntact(page, chunk, sealed, &bytes)) {
      // A FETCH's or a rewrite's check sets the bit (the next of either skips the chunk under
      // verify_on_fetch = "unverified"); the scrubber and copies leave the bookkeeping as it was
      // (a chunk they pass is verified by the next FETCH that reads it).
      if ((reason == VerifyReason::kFetch || reason == VerifyReason::kRewrite) &&
          (seen & kVerifiedBit) == 0) {
        chunk_verified_[key].compare_exchange_strong(
            seen, static_cast<uint8_t>(seen | kVerifiedBit), std::memory_order_acq_rel);
      }
      continue;
    }
    // Found changed, by whichever check: every FETCH that reads it must check it again (another
    // sequence borrowing the page from a cached prefix, or this one after a reload of its data).
    // Read-modify-writes: FETCHes of other sequences may be checking a cached prefix's chunk now.
    chunk_verified_[key].fetch_add(kGenerationStep, std::memory_order_acq_rel);
    chunk_verified_[key].fetch_and(static_cast<uint8_t>(~kVerifiedBit), std::memory_order_acq_rel);
    last_bad_page = page;  // Keys are sorted: one report per page.
    if (++failures <= 4) {
      const uint32_t want =
          chunk_crc_[uint64_t{page} * chunks_per_page_ + chunk].load(std::memory_order_relaxed);
      char crcs[64];
      std::snprintf(crcs, sizeof(crcs), "expected CRC32C %08x, found %08x", want,
                    ChunkCrc(page, chunk, sealed));
      bad += internal::StrCat(bad.empty() ? "" : "; ", "page ", page, " (pool offset ",
                              PageOffset(page), ", ", sealed, " bytes sealed; bytes ",
                              chunk * kChecksumChunkBytes, "..",
                              std::min((chunk + 1) * kChecksumChunkBytes, sealed), "): ", crcs);
    }
  }
  (reason == VerifyReason::kScrub ? scrubbed_bytes_ : verified_bytes_)
      .fetch_add(bytes, std::memory_order_relaxed);
  if (failures == 0) return OkStatus();
  // Release: whoever reads the new count (checksum_failures()) also sees the bits cleared above.
  checksum_failures_.fetch_add(failures, std::memory_order_release);
  return DataLoss("pool: ", failures, failures == 1 ? " page" : " pages",
                  " changed outside the daemon (", bad, failures > 4 ? "; ..." : "", "); found by ",
                  reason == VerifyReason::kScrub ? "the scrubber"
                  : reason == VerifyReason::kFetch
                      ? "FETCH"
                      : "the check before the daemon copied or re-encoded them");
}

Status PageAllocator::VerifyPages(const std::vector<uint32_t>& pages, VerifyReason reason,
                                  VerifyBudget* budget) const {
  if (!checksums_) return OkStatus();
  std::vector<uint64_t> keys;
  for (uint32_t page : pages) {
    KVCTL_CHECK(page < pages_total_);
    const uint32_t sealed = sealed_end_[page].load(std::memory_order_relaxed);
    for (uint32_t c = 0; c * kChecksumChunkBytes < sealed; ++c) {
      const uint64_t key = uint64_t{page} * chunks_per_page_ + c;
      if (!SkipVerified(key, reason)) keys.push_back(key);
    }
  }
  return VerifyChunks(keys, reason, budget);
}

Status PageAllocator::VerifyRanges(const std::vector<PageRange>& ranges, VerifyReason reason,
                                   VerifyBudget* budget) const {
  if (!checksums_) return OkStatus();
  std::vector<uint64_t> keys;
  const bool skip_verified = (reason == VerifyReason::kFetch || reason == VerifyReason::kRewrite) &&
                             fetch_verify_ == FetchVerify::kUnverified;
  uint64_t last = UINT64_MAX;
  for (const PageRange& r : ranges) {
    KVCTL_CHECK(r.page < pages_total_ && r.begin < r.end && r.end <= page_bytes_);
    const uint64_t first = uint64_t{r.page} * chunks_per_page_;
    const uint64_t begin = first + r.begin / kChecksumChunkBytes;
    const uint64_t end = first + (r.end - 1) / kChecksumChunkBytes + 1;
    for (uint64_t key = begin; key < end; ++key) {
      // Neighbouring slots mostly share chunks: skip the repeat before sorting. Chunks a FETCH
      // verified since they were written are left out here, so what is sorted and checked is
      // what changed since (this walk over the slots is what a FETCH with nothing new costs).
      if (key == last) continue;
      last = key;
      if (skip_verified &&
          (chunk_verified_[key].load(std::memory_order_relaxed) & kVerifiedBit) != 0) {
        continue;
      }
      keys.push_back(key);
    }
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return VerifyChunks(keys, reason, budget);
}

uint64_t PageAllocator::SealedBytes(uint32_t page) const {
  if (!checksums_) return 0;
  KVCTL_CHECK(page < pages_total_);
  return sealed_end_[page].load(std::memory_order_relaxed);
}

Status PageAllocator::PullStaging(uint64_t offset, uint64_t bytes) {
  if (!mirrored_) return OkStatus();
  // The controller checked the span against the session's slot; this guards our own bugs.
  KVCTL_CHECK(
      CheckSpanInside("staging", offset, bytes, staging_offset_, arena_->bytes() - staging_offset_)
          .ok());
  return arena_->Pull(offset, bytes);
}

PoolStats PageAllocator::Stats() const {
  MutexLock lock(&mu_);
  PoolStats s;
  s.arena_bytes = arena_->bytes();
  s.page_bytes = page_bytes_;
  s.pages_total = pages_total_;
  s.pages_used = pages_total_ - static_cast<uint32_t>(free_pages_.size());
  s.pages_high_water = pages_high_water_;
  s.bytes_used = uint64_t{s.pages_used} * page_bytes_;
  s.bytes_free = uint64_t{free_pages_.size()} * page_bytes_;
  s.bytes_high_water = uint64_t{pages_high_water_} * page_bytes_;
  s.staging_slots_total = staging_slots_;
  s.staging_slots_used = staging_slots_ - static_cast<uint32_t>(free_slots_.size());
  s.staging_slot_bytes = staging_slot_bytes_;
  s.staging_bytes_total = staging_stride_ * staging_slots_;
  s.alloc_failures_total = alloc_failures_;
  s.publish_ranges_total = publish_ranges_.load(std::memory_order_relaxed);
  s.publish_bytes_total = publish_bytes_.load(std::memory_order_relaxed);
  s.checksum_failures_total = checksum_failures_.load(std::memory_order_relaxed);
  s.scrubbed_bytes_total = scrubbed_bytes_.load(std::memory_order_relaxed);
  s.verified_bytes_total = verified_bytes_.load(std::memory_order_relaxed);
  s.sealed_bytes_total = sealed_bytes_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kvctl
