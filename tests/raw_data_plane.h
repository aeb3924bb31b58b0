// Raw-socket access to a server's data plane for tests that send what no
// client would: partial frames, bad prefaces, frames over a limit.
#ifndef TQKV_TESTS_RAW_DATA_PLANE_H_
#define TQKV_TESTS_RAW_DATA_PLANE_H_

#include <string>

#include "proto/tqkv/v1/tqkv.pb.h"

namespace tqkv::testing {

// A connection to `address` (HOST:PORT, or unix:PATH) whose reads time out
// after 10 s.
int RawConnect(const std::string& address);
// Sends all of `bytes` (a gtest failure otherwise).
void SendRaw(int fd, const std::string& bytes);
// `r` framed as the data plane reads it: its 4-byte length, then its bytes.
std::string Frame(const v1::DataPlaneRequest& r);
// `r` with a raw payload, framed as a connection that opened with
// "TQKVDP02" sends it: u32 N, u64 P, the request, the payload.
std::string RawFrame(const v1::DataPlaneRequest& r, const std::string& payload);
// Reads one reply: its head, and its payload into *payload (dropped when
// null); false if the connection closed or timed out first.
bool ReadReply(int fd, v1::DataPlaneReply* head, std::string* payload = nullptr);
// True once the server has closed `fd` (recv returns 0).
bool ClosedByServer(int fd);

}  // namespace tqkv::testing

#endif  // TQKV_TESTS_RAW_DATA_PLANE_H_
