// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/config/config_schema_rows.h
// Internal to controller/config: how a schema row is built from a member-pointer path (its type,
// scope and field access come from the C++ field, so they cannot disagree), for the files that
// hold rows of the schema table (config_schema.cc, config_schema_tier.cc).
#ifndef KVCTL_CONTROLLER_CONFIG_CONFIG_SCHEMA_ROWS_H_
#define KVCTL_CONTROLLER_CONFIG_CONFIG_SCHEMA_ROWS_H_

#include <string>
#include <type_traits>
#include <vector>

#include "controller/config/config.h"

namespace kvctl::config_rows {

inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * kKiB;
inline constexpr double kGiB = 1024.0 * kMiB;
inline constexpr double kTiB = 1024.0 * kGiB;

// ---- Typed field access, built from a member-pointer path -------------------------------------

template <typename T>
struct MemberOf;
template <typename C, typename M>
struct MemberOf<M C::*> {
  using Class = C;
};

template <typename Root>
constexpr ConfigScope ScopeOf() {
  if constexpr (std::is_same_v<Root, Config>) return ConfigScope::kGlobal;
  if constexpr (std::is_same_v<Root, QuantSettings>) return ConfigScope::kQuant;
  if constexpr (std::is_same_v<Root, QuantOverride>) return ConfigScope::kOverride;
  if constexpr (std::is_same_v<Root, ModelConfig>) return ConfigScope::kModel;
}

// The field's C++ type decides the row's type, so the two cannot disagree. Every uint64_t field
// is a byte size.
template <typename T>
constexpr ConfigType TypeOf() {
  if constexpr (std::is_enum_v<T>) return ConfigType::kEnum;
  if constexpr (std::is_same_v<T, bool>) return ConfigType::kBool;
  if constexpr (std::is_same_v<T, uint64_t>) return ConfigType::kBytes;
  if constexpr (std::is_same_v<T, int>) return ConfigType::kInt;
  if constexpr (std::is_same_v<T, double>) return ConfigType::kDouble;
  if constexpr (std::is_same_v<T, std::string>) return ConfigType::kString;
}

template <auto First, auto... Rest>
struct Field {
  using Root = typename MemberOf<decltype(First)>::Class;
  // Folds the path: ((root.*First).*Second).*Third ...
  static auto& Ref(Root& root) { return ((root.*First).*....*Rest); }
  using Type = std::remove_reference_t<decltype(Ref(std::declval<Root&>()))>;

  static ConfigValue Get(const void* p) {
    const Type& x = Ref(*static_cast<Root*>(const_cast<void*>(p)));
    if constexpr (std::is_enum_v<Type>) {
      return static_cast<int64_t>(x);
    } else if constexpr (std::is_same_v<Type, bool> || std::is_same_v<Type, double> ||
                         std::is_same_v<Type, std::string>) {
      return x;
    } else {
      return static_cast<int64_t>(x);
    }
  }
  static void Set(void* p, const ConfigValue& v) {
    Type& x = Ref(*static_cast<Root*>(p));
    if constexpr (std::is_enum_v<Type>) {
      x = static_cast<Type>(std::get<int64_t>(v));
    } else if constexpr (std::is_same_v<Type, bool> || std::is_same_v<Type, double> ||
                         std::is_same_v<Type, std::string>) {
      x = std::get<Type>(v);
    } else {
      x = static_cast<Type>(std::get<int64_t>(v));
    }
  }
};

template <auto... Path>
ConfigOption Row(ConfigOption row) {
  using F = Field<Path...>;
  row.type = TypeOf<typename F::Type>();
  row.scope = ScopeOf<typename F::Root>();
  row.get = &F::Get;
  row.set = &F::Set;
  return row;
}

// The [tier] rows (config_schema_tier.cc).
std::vector<ConfigOption> TierRows();

}  // namespace kvctl::config_rows

#endif  // KVCTL_CONTROLLER_CONFIG_CONFIG_SCHEMA_ROWS_H_
