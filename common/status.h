// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/status.h
// Status and StatusOr<T>: the error type that crosses every module edge in kvctl. A Status is a
// canonical code plus a message that names the field, the value and what was expected. Errors from
// client input and configuration are Status values; KVCTL_CHECK is for our own invariants only.
//
// Thread safety: values; safe to copy between threads.
//
//   StatusOr<int> ParseBits(int b) {
//     if (b != 2 && b != 4) return InvalidArgument("bits: got ", b, ", expected 2 or 4");
//     return b;
//   }
#ifndef KVCTL_COMMON_STATUS_H_
#define KVCTL_COMMON_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace kvctl {

// Values are part of the wire protocol: never renumber, never reuse.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kAlreadyExists = 3,
  kResourceExhausted = 4,
  kFailedPrecondition = 5,
  kUnavailable = 6,
  kDeadlineExceeded = 7,
  kUnimplemented = 8,
  kInternal = 9,
  kPermissionDenied = 10,
  // Stored data changed behind the daemon's back (a page checksum mismatch): the data is lost.
  kDataLoss = 11,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: bits: got 5, expected one of {2, 3, 4, 8}".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }

namespace internal {
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace internal

template <typename... Args>
Status InvalidArgument(const Args&... args) {
  return Status(StatusCode::kInvalidArgument, internal::StrCat(args...));
}
template <typename... Args>
Status NotFound(const Args&... args) {
  return Status(StatusCode::kNotFound, internal::StrCat(args...));
}
template <typename... Args>
Status AlreadyExists(const Args&... args) {
  return Status(StatusCode::kAlreadyExists, internal::StrCat(args...));
}
template <typename... Args>
Status ResourceExhausted(const Args&... args) {
  return Status(StatusCode::kResourceExhausted, internal::StrCat(args...));
}
template <typename... Args>
Status FailedPrecondition(const Args&... args) {
  return Status(StatusCode::kFailedPrecondition, internal::StrCat(args...));
}
template <typename... Args>
Status Unavailable(const Args&... args) {
  return Status(StatusCode::kUnavailable, internal::StrCat(args...));
}
template <typename... Args>
Status DeadlineExceeded(const Args&... args) {
  return Status(StatusCode::kDeadlineExceeded, internal::StrCat(args...));
}
template <typename... Args>
Status Unimplemented(const Args&... args) {
  return Status(StatusCode::kUnimplemented, internal::StrCat(args...));
}
template <typename... Args>
Status Internal(const Args&... args) {
  return Status(StatusCode::kInternal, internal::StrCat(args...));
}
template <typename... Args>
Status PermissionDenied(const Args&... args) {
  return Status(StatusCode::kPermissionDenied, internal::StrCat(args...));
}
template <typename... Args>
Status DataLoss(const Args&... args) {
  return Status(StatusCode::kDataLoss, internal::StrCat(args...));
}

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}             // NOLINT: implicit by design.
  StatusOr(T&& value) : value_(std::move(value)) {}       // NOLINT
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kvctl

#define KVCTL_INTERNAL_CONCAT2(a, b) a##b
#define KVCTL_INTERNAL_CONCAT(a, b) KVCTL_INTERNAL_CONCAT2(a, b)

#define KVCTL_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::kvctl::Status kvctl_status_ = (expr);        \
    if (!kvctl_status_.ok()) return kvctl_status_; \
  } while (0)

#define KVCTL_ASSIGN_OR_RETURN(lhs, expr) \
  KVCTL_INTERNAL_ASSIGN_OR_RETURN(KVCTL_INTERNAL_CONCAT(kvctl_statusor_, __LINE__), lhs, expr)
#define KVCTL_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()

// Aborts on a broken internal invariant. Never use it on client input or configuration.
#define KVCTL_CHECK(cond)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: KVCTL_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

#endif  // KVCTL_COMMON_STATUS_H_
