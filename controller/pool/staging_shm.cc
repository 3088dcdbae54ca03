// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/pool/staging_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>

namespace kvctl {
namespace {

constexpr const char* kInfix = "-stg-";

StatusOr<std::string> RandomHex(size_t bytes) {
  uint8_t raw[32];
  KVCTL_CHECK(bytes <= sizeof(raw));
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal("staging: getrandom: ", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    out += kDigits[raw[i] >> 4];
    out += kDigits[raw[i] & 15];
  }
  return out;
}

}  // namespace

StagingObject::~StagingObject() {
  munmap(base_, bytes_);
  shm_unlink(name_.c_str());  // Unique random name: nobody else's object can carry it.
}

StagingObjects::StagingObjects(std::string prefix, uint32_t slots, uint64_t bytes)
    : prefix_(std::move(prefix)), slots_(bytes > 0 ? slots : 0), bytes_(slots > 0 ? bytes : 0) {}

StatusOr<std::shared_ptr<StagingObject>> StagingObjects::Acquire() {
  if (slots_ == 0) {
    return FailedPrecondition(
        "staging: disabled (pool.staging_slots or pool.staging_bytes_per_session is 0); send "
        "K/V inline");
  }
  if (used_.fetch_add(1, std::memory_order_relaxed) >= slots_) {
    used_.fetch_sub(1, std::memory_order_relaxed);
    failures_.fetch_add(1, std::memory_order_relaxed);
    return ResourceExhausted("staging: all ", slots_, " slots of ", bytes_, " bytes are in use");
  }
  // From here on a failure gives the slot back.
  const auto fail = [this](Status s) {
    used_.fetch_sub(1, std::memory_order_relaxed);
    failures_.fetch_add(1, std::memory_order_relaxed);
    return s;
  };
  StatusOr<std::string> suffix = RandomHex(16);
  if (!suffix.ok()) return fail(suffix.status());
  const std::string name = prefix_ + kInfix + *suffix;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return fail(ResourceExhausted("staging: shm_open(", name, "): ", std::strerror(errno)));
  }
  const auto fail_fd = [&](Status s) {
    shm_unlink(name.c_str());
    close(fd);
    return fail(std::move(s));
  };
  if (fchmod(fd, 0600) != 0) {
    return fail_fd(Internal("staging: fchmod(", name, ", 0600): ", std::strerror(errno)));
  }
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes_)); err != 0) {
    return fail_fd(ResourceExhausted("staging: cannot reserve ", bytes_, " bytes in /dev/shm for ",
                                     name, ": ", std::strerror(err)));
  }
  void* base = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return fail_fd(
        ResourceExhausted("staging: mmap of ", bytes_, " bytes: ", std::strerror(errno)));
  }
  close(fd);  // The mapping keeps the object; the name stays until the session ends.
  auto* object = new StagingObject(name, static_cast<uint8_t*>(base), bytes_);
  return std::shared_ptr<StagingObject>(object, [this](StagingObject* o) {
    delete o;
    used_.fetch_sub(1, std::memory_order_relaxed);
  });
}

int StagingObjects::RemoveLeftovers() const {
  // shm names live in /dev/shm on Linux; a prefix "/a" names files "a-stg-...".
  const std::string start = prefix_.substr(1) + kInfix;
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (file.size() == start.size() + 32 && file.compare(0, start.size(), start) == 0) {
      if (shm_unlink(("/" + file).c_str()) == 0) ++removed;
    }
  }
  return removed;
}

StatusOr<const uint8_t*> StagingSnapshot::Copy(const StagingObject& object, uint64_t offset,
                                               uint64_t bytes) {
  KVCTL_CHECK(offset <= object.bytes() && bytes <= object.bytes() - offset);
  if (bytes > capacity_) {
    data_.reset();  // The old copy first: two at once could exceed what the host has.
    capacity_ = 0;
    data_.reset(new (std::nothrow) uint8_t[bytes]);
    if (!data_) {
      return ResourceExhausted("APPEND: no host memory for a private copy of ", bytes,
                               " staged bytes");
    }
    capacity_ = bytes;
  }
  std::memcpy(data_.get(), object.data() + offset, bytes);
  return data_.get();
}

void StagingSnapshot::Trim(bool more_pieces) {
  if (capacity_ <= (more_pieces ? kRetainPieceBytes : kRetainBytes)) return;
  data_.reset();
  capacity_ = 0;
}

}  // namespace kvctl
