"""Loads the generated tqkv.v1 stubs.

An installed wheel carries them as `tqkv._stubs` (client/python/build_wheel.sh).
In the source tree Bazel generates them as `proto/tqkv/v1/tqkv_pb2{,_grpc}.py`
(genrule //proto/tqkv/v1:tqkv_py_proto); with the runfiles root on sys.path
they import as `proto.tqkv.v1`. Outside Bazel, point TQKV_PROTO_PATH at a
directory that holds that tree (e.g. `$(bazel info bazel-bin)`).
"""
import os
import sys

try:
    from ._stubs import tqkv_pb2 as pb
    from ._stubs import tqkv_pb2_grpc as pb_grpc
except ImportError:
    _extra = os.environ.get("TQKV_PROTO_PATH")
    if _extra and _extra not in sys.path:
        sys.path.append(_extra)
    from proto.tqkv.v1 import tqkv_pb2 as pb  # noqa: E402
    from proto.tqkv.v1 import tqkv_pb2_grpc as pb_grpc  # noqa: E402

__all__ = ["pb", "pb_grpc"]
