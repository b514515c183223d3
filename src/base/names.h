// Short names of data types and quantization modes, as explain, the self-test report and the
// call signatures print them (the tools' own --dtype / --quant values).
#pragma once

#include "anyreduce/anyreduce.h"

namespace anyr {

// "fp32", "fp16", "bf16"; NULL for another value.
inline const char* dtypeShortName(int t) {
  switch (t) {
    case anyrFloat32:
      return "fp32";
    case anyrFloat16:
      return "fp16";
    case anyrBfloat16:
      return "bf16";
    default:
      return nullptr;
  }
}

// "none", "fp8", "nvfp4" (anyrQuantNone, anyrQuantFp8, anyrQuantNvfp4); NULL for another value.
inline const char* quantName(int q) {
  switch (q) {
    case anyrQuantNone:
      return "none";
    case anyrQuantFp8:
      return "fp8";
    case anyrQuantNvfp4:
      return "nvfp4";
    default:
      return nullptr;
  }
}

}  // namespace anyr
