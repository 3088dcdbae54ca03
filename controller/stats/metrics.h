// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/stats/metrics.h
// Renders the STATS text (INFO-style sections) as Prometheus text exposition format 0.0.4, so
// there is one stats model with two renderings:
//   `field:123`            -> kvctl_field 123 (a counter when the name ends in _total)
//   `layer_3:tokens=5,...` -> kvctl_layer_tokens{layer="3"} 5
//   `head_3_1:tokens=5`    -> kvctl_head_tokens{layer="3",head="1"} 5
//   `seq_7_2:client=x,...` -> kvctl_sequence_tokens{session="7",sequence="2",client="x"} 5
//   `field:text`           -> kvctl_<section>_info{field="text",...} 1
//
// Thread safety: pure function.
#ifndef KVCTL_CONTROLLER_STATS_METRICS_H_
#define KVCTL_CONTROLLER_STATS_METRICS_H_

#include <string>
#include <string_view>

namespace kvctl {

// Every family gets `# HELP` (MetricHelp, or a bare "kvctl <section>: <field>" placeholder for a
// field without a sentence, which tests refuse) and `# TYPE`.
std::string RenderPrometheus(std::string_view stats_text);

// The HELP sentence of a family ("kvctl_pages_used": what it counts and its unit); "" if none.
std::string MetricHelp(std::string_view family);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_STATS_METRICS_H_
