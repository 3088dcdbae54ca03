// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/stats/metrics.h"

#include <cctype>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

namespace kvctl {
namespace {

struct Family {
  std::string type;  // "counter" or "gauge".
  std::string help;
  std::vector<std::string> samples;
};

bool IsNumber(std::string_view s) {
  if (s.empty()) return false;
  const std::string str(s);
  char* end = nullptr;
  std::strtod(str.c_str(), &end);
  return end == str.c_str() + str.size();
}

std::string Escape(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string Sanitize(std::string_view name) {
  std::string out;
  for (char c : name) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(sep, start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? s.npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

// "head_3_1" -> ("head", {layer="3", head="1"}); unknown shapes -> ("", "").
bool EntityLabels(std::string_view key, std::string* entity, std::string* labels) {
  const std::vector<std::string> parts = Split(key, '_');
  auto all_digits = [](const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (parts.size() == 2 && parts[0] == "layer" && all_digits(parts[1])) {
    *entity = "layer";
    *labels = "layer=\"" + parts[1] + "\"";
    return true;
  }
  if (parts.size() == 3 && parts[0] == "head" && all_digits(parts[1]) && all_digits(parts[2])) {
    *entity = "head";
    *labels = "layer=\"" + parts[1] + "\",head=\"" + parts[2] + "\"";
    return true;
  }
  if (parts.size() == 3 && parts[0] == "seq" && all_digits(parts[1]) && all_digits(parts[2])) {
    *entity = "sequence";
    *labels = "session=\"" + parts[1] + "\",sequence=\"" + parts[2] + "\"";
    return true;
  }
  return false;
}

}  // namespace

std::string RenderPrometheus(std::string_view text) {
  std::vector<std::string> order;
  std::map<std::string, Family> families;
  // `placeholder` is the HELP of a family MetricHelp has no sentence for.
  auto add = [&](const std::string& name, const std::string& placeholder,
                 const std::string& sample) {
    auto [it, inserted] = families.try_emplace(name);
    if (inserted) {
      order.push_back(name);
      const bool counter = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
      it->second.type = counter ? "counter" : "gauge";
      it->second.help = MetricHelp(name);
      if (it->second.help.empty()) it->second.help = placeholder;
    }
    it->second.samples.push_back(sample);
  };
  std::string section = "server";
  std::map<std::string, std::string> info_labels;  // section -> label list of text fields.
  std::vector<std::string> info_order;
  for (const std::string& line : Split(text, '\n')) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      section = Sanitize(line.substr(line.find_first_not_of("# ")));
      for (char& c : section) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    const std::string value = line.substr(colon + 1);
    std::string entity, labels;
    if (value.find('=') != std::string::npos && EntityLabels(key, &entity, &labels)) {
      std::vector<std::pair<std::string, std::string>> numeric;
      for (const std::string& kv : Split(value, ',')) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) continue;
        const std::string k = Sanitize(kv.substr(0, eq)), v = kv.substr(eq + 1);
        if (IsNumber(v)) {
          numeric.emplace_back(k, v);
        } else {
          labels += "," + k + "=\"" + Escape(v) + "\"";
        }
      }
      for (const auto& [k, v] : numeric) {
        const std::string name = "kvctl_" + entity + "_" + k;
        add(name, "kvctl " + section + ": " + k + " per " + entity, name + "{" + labels + "} " + v);
      }
      continue;
    }
    if (IsNumber(value)) {
      const std::string name = "kvctl_" + Sanitize(key);
      add(name, "kvctl " + section + ": " + key, name + " " + value);
    } else {
      if (!info_labels.count(section)) info_order.push_back(section);
      std::string& l = info_labels[section];
      l += (l.empty() ? "" : ",") + Sanitize(key) + "=\"" + Escape(value) + "\"";
    }
  }
  for (const std::string& s : info_order) {
    const std::string name = "kvctl_" + s + "_info";
    add(name, "kvctl " + s + ": text fields as labels", name + "{" + info_labels[s] + "} 1");
  }
  std::ostringstream out;
  for (const std::string& name : order) {
    const Family& f = families[name];
    out << "# HELP " << name << " " << f.help << "\n# TYPE " << name << " " << f.type << "\n";
    for (const std::string& s : f.samples) out << s << "\n";
  }
  return out.str();
}

}  // namespace kvctl
