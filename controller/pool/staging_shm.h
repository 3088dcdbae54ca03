// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/pool/staging_shm.h
// Per-session staging objects of a cpu pool: each session that gets staging gets its own POSIX
// shm object, <pool.shm_name>-stg-<32 hex digits from getrandom>, mode 0600, which only that
// session's engine is told about (HELLO's staging_shm_name). Engines map it read-write and the
// pool itself read-only, so no client can write a page of the pool or another session's staging
// (docs/reliability.md "Page checksums"). The name is unlinked when the session ends; the memory
// goes when the last mapping does (an APPEND in flight keeps its reference).
//
// Slots are counted against pool.staging_slots; Controller::Create sizes the pool object to
// pool.bytes less the staging objects' bytes, so pool + staging never exceed pool.bytes.
//
// Thread safety: StagingObjects is internally synchronized; a StagingObject is immutable.
//
//   StagingObjects staging("/kvctl-pool", 4, 8 << 20);
//   std::shared_ptr<StagingObject> mine = staging.Acquire();  // Null when every slot is taken.
//   reply.staging_shm_name = mine->name();
//
// StagingSnapshot: what an APPEND reads of a staging object, copied out first (see the class).
#ifndef KVCTL_CONTROLLER_POOL_STAGING_SHM_H_
#define KVCTL_CONTROLLER_POOL_STAGING_SHM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace kvctl {

class StagingObject {
 public:
  ~StagingObject();  // Unlinks the name (if still ours) and unmaps.
  StagingObject(const StagingObject&) = delete;
  StagingObject& operator=(const StagingObject&) = delete;

  const std::string& name() const { return name_; }
  uint8_t* data() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class StagingObjects;
  StagingObject(std::string name, uint8_t* base, uint64_t bytes)
      : name_(std::move(name)), base_(base), bytes_(bytes) {}

  const std::string name_;
  uint8_t* const base_;
  const uint64_t bytes_;
};

// A private copy of the bytes one APPEND reads from its session's staging object. The engine
// maps its object read-write and may rewrite it at any moment, even while the daemon handles the
// APPEND (a buggy or hostile engine can): bytes checked in place and read again to be stored can
// differ between the two reads, and a non-finite row that passed the check would then sit in the
// pool, where every later flush of the sequence refuses it (docs/reliability.md "A slot rewritten
// during its APPEND"). So APPEND copies the bytes once and reads only the copy.
//
// Thread safety: none; one per thread that handles APPENDs (each handles one at a time). A copy
// of at most kRetainBytes (a decode step's rows: tens of KiB) is kept for the next APPEND;
// Trim gives back a larger one (a prefill chunk, up to pool.staging_bytes_per_session), except
// between the pieces of one prefill (APPEND_CONTINUES) up to kRetainPieceBytes: allocating the
// buffer again for each piece faulted in fresh pages for every byte staged.
class StagingSnapshot {
 public:
  static constexpr uint64_t kRetainBytes = uint64_t{1} << 20;
  static constexpr uint64_t kRetainPieceBytes = uint64_t{64} << 20;

  // Copies bytes [offset, offset + bytes) of `object` and returns the copy, valid until the next
  // Copy or Trim. RESOURCE_EXHAUSTED when the memory for it cannot be had.
  // REQUIRES: offset + bytes <= object.bytes() (the caller checked the span against the slot).
  StatusOr<const uint8_t*> Copy(const StagingObject& object, uint64_t offset, uint64_t bytes);
  // Frees a copy larger than kRetainBytes; with more_pieces (the APPEND was flagged
  // APPEND_CONTINUES), only one larger than kRetainPieceBytes.
  void Trim(bool more_pieces);
  // Bytes of the copy buffer held now.
  uint64_t retained_bytes() const { return capacity_; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  uint64_t capacity_ = 0;
};

class StagingObjects {
 public:
  // `prefix` is the pool's shm name; slots = 0 or bytes = 0: no staging.
  StagingObjects(std::string prefix, uint32_t slots, uint64_t bytes);
  StagingObjects(const StagingObjects&) = delete;
  StagingObjects& operator=(const StagingObjects&) = delete;

  // A new object for one session. RESOURCE_EXHAUSTED when every slot is taken or /dev/shm cannot
  // hold it; FAILED_PRECONDITION when staging is off. The slot is free again when the returned
  // object is destroyed. REQUIRES: this outlives every object it returned.
  StatusOr<std::shared_ptr<StagingObject>> Acquire();

  // Removes objects named <prefix>-stg-* left by a daemon that died: call once, while holding the
  // pool (so no live daemon uses the prefix). Returns how many were removed.
  int RemoveLeftovers() const;

  uint32_t slots() const { return slots_; }
  uint32_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t slot_bytes() const { return bytes_; }
  // Acquire calls refused for want of a slot or of /dev/shm memory.
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }
  // Names are "<prefix>-stg-" + 32 hex digits.
  static constexpr size_t kSuffixChars = 5 + 32;

 private:
  const std::string prefix_;
  const uint32_t slots_;
  const uint64_t bytes_;
  std::atomic<uint32_t> used_{0};
  std::atomic<uint64_t> failures_{0};
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_POOL_STAGING_SHM_H_
