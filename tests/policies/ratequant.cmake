# RateQuant: solvers, plans, calibration fit and profiles; [.bench] cases print the timings and
# the quality table of docs/ratequant.md.
kvctl_cc_test(NAME ratequant_test
  SRCS ratequant_test.cc ratequant_fit_test.cc ratequant_bench_test.cc
  DEPS kvctl_policies_ratequant kvctl_synth)

# The daemon's own config loader must accept the override tables a plan writes.
if(TARGET kvctl_controller)
  kvctl_cc_test(NAME ratequant_config_test SRCS ratequant_config_test.cc
    DEPS kvctl_policies_ratequant kvctl_controller)
endif()
