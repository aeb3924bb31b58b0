"""Exceptions raised by the client; each carries the gRPC status code.

Every failed RPC raises a subclass of `TqkvError` chosen by its status code
(the wire contract in proto/tqkv/v1/tqkv.proto says what each code means).
`InvalidArgument` is also a `ValueError` and `NotFound` also a `KeyError`, so
callers that do not care about gRPC can catch the builtin types.
"""
import grpc


class TqkvError(Exception):
    """An RPC failed. `code` is a grpc.StatusCode, `details` the server's message."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, details="", code=None, method=""):
        if code is not None:
            self.code = code
        self.details = details
        self.method = method
        super().__init__(details)

    def __str__(self):
        where = f" in {self.method}" if self.method else ""
        return f"{self.code.name}{where}: {self.details}"

    # KeyError quotes its argument in __str__; keep ours readable.
    __repr__ = __str__


class InvalidArgument(TqkvError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(TqkvError, KeyError):
    code = grpc.StatusCode.NOT_FOUND

    def __str__(self):
        return TqkvError.__str__(self)


class FailedPrecondition(TqkvError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(TqkvError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(TqkvError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DataLoss(TqkvError):
    code = grpc.StatusCode.DATA_LOSS


class Unavailable(TqkvError):
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(TqkvError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(TqkvError):
    code = grpc.StatusCode.PERMISSION_DENIED


class DeadlineExceeded(TqkvError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(TqkvError):
    code = grpc.StatusCode.ABORTED


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, FailedPrecondition, AlreadyExists,
                ResourceExhausted, DataLoss, Unavailable, Unauthenticated,
                PermissionDenied, DeadlineExceeded, Aborted)
}


def from_rpc_error(err, method=""):
    """Converts a grpc.RpcError into the matching TqkvError subclass."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, TqkvError)
    return cls(details or "", code=code, method=method)
