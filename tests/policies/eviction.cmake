kvctl_cc_test(NAME eviction_test
  SRCS eviction_test.cc reasonalloc_test.cc
  DEPS kvctl_policies_eviction)
