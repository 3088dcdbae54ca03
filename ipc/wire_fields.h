// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/wire_fields.h
// Internal to ipc/protocol*.cc: the field tables of ipc/messages.def bound to the structs of
// ipc/messages.h, and the one generic body writer and reader that walk them. For every body
// struct S there is
//   template <typename V, typename M> Status VisitFields(V& v, M& m);  // M = S or const S
// which calls the visitor once per field of the table, in wire order. Binding a table row to a
// member checks at compile time that the member has the row's wire width (an enum row needs an
// enum of that width, an array row a vector of that element, ...), so the table and the structs
// cannot drift apart. Semantic rules stay in each message's Validate().
//
// Thread safety: free functions over values.
//
//   WireWriter w;
//   WriteFields(w, PingRequest{.session_id = 3});      // 8 bytes: the session id
//   KVCTL_RETURN_IF_ERROR(ReadFields(reader, &ping));
#ifndef KVCTL_IPC_WIRE_FIELDS_H_
#define KVCTL_IPC_WIRE_FIELDS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "ipc/messages.h"
#include "ipc/wire.h"

namespace kvctl::ipc {

// Shared field check; messages read "<field>: got <value>, expected <lo>..<hi>".
Status CheckRange(std::string_view field, uint64_t value, uint64_t lo, uint64_t hi);

// How many entries an array field has, from the fields before it (messages.def "count rule").
enum class CountRule { kPairs, kPairsPlusOne, kNnz, kSideNnz, kWindowNnz, kRunNnz, kKnown };
// Defined in protocol_fetch.cc for the three messages with arrays. kPairs and kPairsPlusOne first
// check the pair shape, so no array is sized from an out-of-range field.
StatusOr<uint64_t> ArrayCount(CountRule rule, const FetchRequest& m);
StatusOr<uint64_t> ArrayCount(CountRule rule, const FetchDenseReply& m);
StatusOr<uint64_t> ArrayCount(CountRule rule, const FetchBlocksReply& m);

// The values of an enum that messages.def lists, contiguous from kMin to kMax; a static_assert
// per row checks the C++ enumerator against the table (DType and StatusCode live in common/).
template <typename E>
struct WireEnum;
#define KVCTL_WIRE_ENUM_VALUE(cpp, PY, number) number,
#define KVCTL_WIRE_ENUM_MATCHES(cpp, PY, number) \
  static_assert(static_cast<uint32_t>(E::cpp) == (number), "messages.def: " #cpp);
#define KVCTL_WIRE_DEFINE_ENUM(Enum)                                                        \
  template <>                                                                               \
  struct WireEnum<Enum> {                                                                   \
    using E = Enum;                                                                         \
    KVCTL_WIRE_ENUM_##Enum(KVCTL_WIRE_ENUM_MATCHES) static constexpr uint32_t kValues[] = { \
        KVCTL_WIRE_ENUM_##Enum(KVCTL_WIRE_ENUM_VALUE)};                                     \
    static constexpr uint32_t kMin = kValues[0];                                            \
    static constexpr uint32_t kMax = kValues[std::size(kValues) - 1];                       \
    static_assert(kMax - kMin + 1 == std::size(kValues), "messages.def: enum has gaps");    \
  };
KVCTL_WIRE_DEFINE_ENUM(StatusCode)
KVCTL_WIRE_DEFINE_ENUM(DType)
KVCTL_WIRE_DEFINE_ENUM(PoolLocation)
KVCTL_WIRE_DEFINE_ENUM(AppendSource)
KVCTL_WIRE_DEFINE_ENUM(FetchMode)
#undef KVCTL_WIRE_DEFINE_ENUM
#undef KVCTL_WIRE_ENUM_MATCHES
#undef KVCTL_WIRE_ENUM_VALUE

// One visitor call per row kind (messages.def "Field kinds"). `frame` rows are not in frame 0 (the
// frames are each message's TakeTensorFrames/PutTensorFrames); the row must still name a member.
#define KVCTL_WIRE_VISIT_u8(n, member, arg) KVCTL_RETURN_IF_ERROR(v.template Int<1>(#n, m.member));
#define KVCTL_WIRE_VISIT_u16(n, member, arg) KVCTL_RETURN_IF_ERROR(v.template Int<2>(#n, m.member));
#define KVCTL_WIRE_VISIT_u32(n, member, arg) KVCTL_RETURN_IF_ERROR(v.template Int<4>(#n, m.member));
#define KVCTL_WIRE_VISIT_u64(n, member, arg) KVCTL_RETURN_IF_ERROR(v.template Int<8>(#n, m.member));
#define KVCTL_WIRE_VISIT_bool(n, member, arg) KVCTL_RETURN_IF_ERROR(v.Bool(#n, m.member));
#define KVCTL_WIRE_VISIT_enum8(n, member, arg) \
  KVCTL_RETURN_IF_ERROR(v.template Enum<1>(#n, m.member));
#define KVCTL_WIRE_VISIT_enum32(n, member, arg) \
  KVCTL_RETURN_IF_ERROR(v.template Enum<4>(#n, m.member));
#define KVCTL_WIRE_VISIT_str(n, member, arg) KVCTL_RETURN_IF_ERROR(v.Str(#n, m.member, arg));
#define KVCTL_WIRE_VISIT_bytes(n, member, arg)                                         \
  static_assert(sizeof(m.member) == (arg), "messages.def: " #n " has the wrong size"); \
  KVCTL_RETURN_IF_ERROR(v.Bytes(#n, m.member));
#define KVCTL_WIRE_VISIT_tag(n, member, arg) KVCTL_RETURN_IF_ERROR(v.Tag(#n, arg));
#define KVCTL_WIRE_VISIT_reserved8(n, member, arg) KVCTL_RETURN_IF_ERROR(v.Tag(#n, 0));
#define KVCTL_WIRE_VISIT_struct(n, member, arg) KVCTL_RETURN_IF_ERROR(v.Struct(#n, m.member));
#define KVCTL_WIRE_VISIT_count16(n, member, arg) \
  KVCTL_RETURN_IF_ERROR(v.Count16(#n, m.member, arg));
#define KVCTL_WIRE_VISIT_structs(n, member, arg) KVCTL_RETURN_IF_ERROR(v.Structs(#n, m.member));
#define KVCTL_WIRE_VISIT_u16s(n, member, arg) \
  KVCTL_RETURN_IF_ERROR(v.Array(#n, m.member, CountRule::k##arg, m));
#define KVCTL_WIRE_VISIT_u32s(n, member, arg) \
  KVCTL_RETURN_IF_ERROR(v.Array(#n, m.member, CountRule::k##arg, m));
#define KVCTL_WIRE_VISIT_u64s(n, member, arg) \
  KVCTL_RETURN_IF_ERROR(v.Array(#n, m.member, CountRule::k##arg, m));
#define KVCTL_WIRE_VISIT_frame(n, member, arg) \
  static_assert(sizeof(m.member) > 0, "messages.def: frame " #n);
#define KVCTL_WIRE_VISIT_FIELD(kind, n, member, arg, meaning) \
  KVCTL_WIRE_VISIT_##kind(n, member, arg)

#define KVCTL_WIRE_DEFINE_VISIT(Struct)                                       \
  template <typename V, typename M>                                           \
  requires std::is_same_v<std::remove_const_t<M>, Struct> Status VisitFields( \
      [[maybe_unused]] V& v, [[maybe_unused]] M& m) {                         \
    KVCTL_WIRE_BODY_##Struct(KVCTL_WIRE_VISIT_FIELD) return OkStatus();       \
  }
KVCTL_WIRE_DEFINE_VISIT(Geometry)
KVCTL_WIRE_DEFINE_VISIT(QuantInfo)
KVCTL_WIRE_DEFINE_VISIT(RecordLayout)
#define KVCTL_WIRE_DEFINE_REQUEST_VISIT(cpp, NAME, number, Request) KVCTL_WIRE_DEFINE_VISIT(Request)
KVCTL_WIRE_MESSAGE_TYPES(KVCTL_WIRE_DEFINE_REQUEST_VISIT)
#undef KVCTL_WIRE_DEFINE_REQUEST_VISIT
#define KVCTL_WIRE_DEFINE_REPLY_VISIT(Reply, request) KVCTL_WIRE_DEFINE_VISIT(Reply)
KVCTL_WIRE_REPLIES(KVCTL_WIRE_DEFINE_REPLY_VISIT)
#undef KVCTL_WIRE_DEFINE_REPLY_VISIT
KVCTL_WIRE_DEFINE_VISIT(ErrorReply)
#undef KVCTL_WIRE_DEFINE_VISIT

// Appends the fields to `w`. Never fails: run Validate() first.
class FieldWriter {
 public:
  explicit FieldWriter(WireWriter& w) : w_(w) {}

  template <int kBytes, typename T>
  Status Int(std::string_view, const T& value) {
    static_assert(std::is_unsigned_v<T> && sizeof(T) == kBytes, "messages.def: width mismatch");
    Put<kBytes>(value);
    return OkStatus();
  }
  template <int kBytes, typename E>
  Status Enum(std::string_view, const E& value) {
    static_assert(std::is_enum_v<E> && (kBytes == 4 || sizeof(E) == kBytes),
                  "messages.def: enum width mismatch");
    Put<kBytes>(static_cast<uint64_t>(value));
    return OkStatus();
  }
  Status Bool(std::string_view, bool value) {
    w_.U8(value ? 1 : 0);
    return OkStatus();
  }
  Status Str(std::string_view, const std::string& s, size_t) {
    w_.Str(s);
    return OkStatus();
  }
  template <size_t kN>
  Status Bytes(std::string_view, const std::array<uint8_t, kN>& bytes) {
    w_.Bytes(bytes.data(), kN);
    return OkStatus();
  }
  Status Tag(std::string_view, uint8_t value) {
    w_.U8(value);
    return OkStatus();
  }
  template <typename S>
  Status Struct(std::string_view, const S& s) {
    return VisitFields(*this, s);
  }
  template <typename S>
  Status Count16(std::string_view, const std::vector<S>& items, uint32_t) {
    w_.U16(static_cast<uint16_t>(items.size()));
    return OkStatus();
  }
  template <typename S>
  Status Structs(std::string_view, const std::vector<S>& items) {
    for (const S& s : items) KVCTL_RETURN_IF_ERROR(VisitFields(*this, s));
    return OkStatus();
  }
  template <typename T, typename M>
  Status Array(std::string_view, const std::vector<T>& a, CountRule, const M&) {
    static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, uint32_t> ||
                  std::is_same_v<T, uint64_t>);
    if constexpr (std::is_same_v<T, uint16_t>) {
      w_.U16Array(a);
    } else if constexpr (std::is_same_v<T, uint32_t>) {
      w_.U32Array(a);
    } else {
      w_.U64Array(a);
    }
    return OkStatus();
  }

 private:
  template <int kBytes>
  void Put(uint64_t v) {
    if constexpr (kBytes == 1) w_.U8(static_cast<uint8_t>(v));
    if constexpr (kBytes == 2) w_.U16(static_cast<uint16_t>(v));
    if constexpr (kBytes == 4) w_.U32(static_cast<uint32_t>(v));
    if constexpr (kBytes == 8) w_.U64(v);
  }
  WireWriter& w_;
};

// Reads the fields from `r`, checking what the bytes alone decide: lengths, string limits and
// UTF-8, enum and bool ranges, tags, array counts. Field names in errors carry the path of a
// nested struct ("quant.k_bits", "layouts[1].record_bytes").
class FieldReader {
 public:
  explicit FieldReader(WireReader& r, std::string prefix = "")
      : r_(r), prefix_(std::move(prefix)) {}

  template <int kBytes, typename T>
  Status Int(std::string_view name, T& out) {
    static_assert(std::is_unsigned_v<T> && sizeof(T) == kBytes, "messages.def: width mismatch");
    return Named(name, [&](std::string_view n) {
      if constexpr (kBytes == 1) return r_.U8(n, &out);
      if constexpr (kBytes == 2) return r_.U16(n, &out);
      if constexpr (kBytes == 4) return r_.U32(n, &out);
      if constexpr (kBytes == 8) return r_.U64(n, &out);
    });
  }
  template <int kBytes, typename E>
  Status Enum(std::string_view name, E& out) {
    static_assert(std::is_enum_v<E> && (kBytes == 4 || sizeof(E) == kBytes),
                  "messages.def: enum width mismatch");
    return Named(name, [&](std::string_view n) -> Status {
      uint32_t raw = 0;
      if constexpr (kBytes == 1) {
        uint8_t byte;
        KVCTL_RETURN_IF_ERROR(r_.U8(n, &byte));
        raw = byte;
      } else {
        KVCTL_RETURN_IF_ERROR(r_.U32(n, &raw));
      }
      KVCTL_RETURN_IF_ERROR(CheckRange(n, raw, WireEnum<E>::kMin, WireEnum<E>::kMax));
      out = static_cast<E>(raw);
      return OkStatus();
    });
  }
  Status Bool(std::string_view name, bool& out) {
    return Named(name, [&](std::string_view n) -> Status {
      uint8_t byte;
      KVCTL_RETURN_IF_ERROR(r_.U8(n, &byte));
      KVCTL_RETURN_IF_ERROR(CheckRange(n, byte, 0, 1));
      out = byte != 0;
      return OkStatus();
    });
  }
  Status Str(std::string_view name, std::string& out, size_t max_bytes) {
    return Named(name, [&](std::string_view n) { return r_.Str(n, max_bytes, &out); });
  }
  template <size_t kN>
  Status Bytes(std::string_view name, std::array<uint8_t, kN>& out) {
    return Named(name, [&](std::string_view n) { return r_.Bytes(n, kN, out.data()); });
  }
  Status Tag(std::string_view name, uint8_t value) {
    return Named(name, [&](std::string_view n) -> Status {
      uint8_t byte;
      KVCTL_RETURN_IF_ERROR(r_.U8(n, &byte));
      return CheckRange(n, byte, value, value);
    });
  }
  template <typename S>
  Status Struct(std::string_view name, S& s) {
    if (name.empty()) return VisitFields(*this, s);
    FieldReader inner(r_, prefix_ + std::string(name) + ".");
    return VisitFields(inner, s);
  }
  template <typename S>
  Status Count16(std::string_view name, std::vector<S>& items, uint32_t max) {
    return Named(name, [&](std::string_view n) -> Status {
      uint16_t count;
      KVCTL_RETURN_IF_ERROR(r_.U16(n, &count));
      KVCTL_RETURN_IF_ERROR(CheckRange(n, count, 1, max));
      items.resize(count);
      return OkStatus();
    });
  }
  template <typename S>
  Status Structs(std::string_view name, std::vector<S>& items) {
    for (size_t i = 0; i < items.size(); ++i) {
      FieldReader inner(r_, prefix_ + std::string(name) + "[" + std::to_string(i) + "].");
      KVCTL_RETURN_IF_ERROR(VisitFields(inner, items[i]));
    }
    return OkStatus();
  }
  template <typename T, typename M>
  Status Array(std::string_view name, std::vector<T>& out, CountRule rule, const M& m) {
    static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, uint32_t> ||
                  std::is_same_v<T, uint64_t>);
    KVCTL_ASSIGN_OR_RETURN(const uint64_t count, ArrayCount(rule, m));
    return Named(name, [&](std::string_view n) {
      if constexpr (std::is_same_v<T, uint16_t>) {
        return r_.U16Array(n, count, &out);
      } else if constexpr (std::is_same_v<T, uint32_t>) {
        return r_.U32Array(n, count, &out);
      } else {
        return r_.U64Array(n, count, &out);
      }
    });
  }

 private:
  // Runs `read` with the bare field name; inside a nested struct, and only if it fails, runs it
  // again from the same offset with the full name ("layouts[0].record_bytes") for the error.
  // Formatting the full name for every field (an allocation each) was most of the time a client
  // spent decoding a blocks FETCH reply (docs/kvbench_ipc.md "The request path, third round").
  // A read fails the same way twice: same bytes, same offset, same checks.
  template <typename F>
  Status Named(std::string_view name, F&& read) {
    if (prefix_.empty()) return read(name);
    const size_t offset = r_.offset();
    Status s = read(name);
    if (s.ok()) return s;
    r_.Rewind(offset);
    const std::string full = prefix_ + std::string(name);
    return read(std::string_view(full));
  }
  WireReader& r_;
  std::string prefix_;
};

template <typename M>
void WriteFields(WireWriter& w, const M& m) {
  FieldWriter writer(w);
  (void)VisitFields(writer, m);  // Writing cannot fail.
}

template <typename M>
Status ReadFields(WireReader& r, M* m) {
  FieldReader reader(r);
  return VisitFields(reader, *m);
}

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_WIRE_FIELDS_H_
