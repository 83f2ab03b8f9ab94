"""The framing of the TCP data-transfer protocol, shared by the worker's server
(``dataservice.worker.data_server``) and the client's transport (``dataservice.client.transports``).

Messages (little endian)::

    request:  u32 length | GetElementsRequest
    response: u32 header length | u64 prefix length | u64 frame length
              | ElementChunk header (no data) | frame (its prefix, then its out-of-band buffers)

The frame is ``dataservice.service.wire``'s; an answer by address (same-host memory reads)
carries only the prefix, and the frame length equals the prefix length.

Example::

    >>> sock.sendall(REQUEST_HEADER.pack(len(body)) + body)
    >>> header_len, prefix_len, frame_len = RESPONSE_HEADER.unpack(fixed)
"""

from __future__ import annotations

import socket
import struct

__all__ = ["REQUEST_HEADER", "RESPONSE_HEADER", "MAX_REQUEST_BYTES", "recv_into_exact"]

REQUEST_HEADER = struct.Struct("<I")
RESPONSE_HEADER = struct.Struct("<IQQ")
#: A request is a few small integers: anything longer is not one of ours.
MAX_REQUEST_BYTES = 4096


def recv_into_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fills ``view`` from ``sock``; False if the peer closed the connection first."""
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True
