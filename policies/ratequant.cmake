#RateQuant per - head bit allocation(ratequant.h) and its calibration fit and TOML profile
#(ratequant_fit.h).toml ++ reads the profiles.
find_package(tomlplusplus REQUIRED)
    kvctl_cc_library(NAME kvctl_policies_ratequant SRCS ratequant.cc ratequant_fit.cc DEPS
                         kvctl_kernels tomlplusplus::tomlplusplus)
