# Token eviction scorers (StreamingLLM, H2O, SnapKV, R-KV), SelectKeep, the retained-attention
# metric and ReasonAlloc-like layer/head budgets: pure functions over fp32 keys and query rows.
kvctl_cc_library(NAME kvctl_policies_eviction
  SRCS eviction.cc reasonalloc.cc
  DEPS kvctl_common)
