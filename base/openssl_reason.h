// OpenSSL's reason for a failure, for status messages (client and server
// TLS share it).
#ifndef TQKV_BASE_OPENSSL_REASON_H_
#define TQKV_BASE_OPENSSL_REASON_H_

#include <openssl/err.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace tqkv {

// The reason of the first error on this thread's OpenSSL error queue (the
// queue is then cleared), or `fallback` when it is empty.
inline std::string OpenSslReason(const char* fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  const char* reason = ERR_reason_error_string(e);
  return reason != nullptr ? reason : absl::StrCat("OpenSSL error ", e);
}

}  // namespace tqkv

#endif  // TQKV_BASE_OPENSSL_REASON_H_
