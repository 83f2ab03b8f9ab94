"""TLS for the cluster: gRPC on the dispatcher and workers, and the workers' TCP data path.

TLS authenticates the hosts and encrypts everything on the wire; the cluster token
(``dataservice.service.auth``) still says who is a member, and its handshakes run inside TLS.

- A server (dispatcher, worker) has a certificate and its key (``--tls-cert``, ``--tls-key``);
  with ``--tls-client-ca`` it requires every client to present a certificate signed by that CA
  (mutual TLS).
- A client (a reader, ``dataservice status``, and a worker talking to its dispatcher) verifies
  the servers against a CA (``tls_ca=``, ``--tls-ca``, else ``$DATASERVICE_TLS_CA``) and checks
  that their certificate names the host it connects to (``localhost``, an IP, a DNS name: put
  each in the certificate's subjectAltName). Under mutual TLS it presents its own certificate
  (``tls_cert=``/``tls_key=``, ``--tls-cert``/``--tls-key``, else ``$DATASERVICE_TLS_CERT`` /
  ``$DATASERVICE_TLS_KEY``); a worker presents its server certificate, which therefore must
  allow client authentication too (no extendedKeyUsage, or both serverAuth and clientAuth).

Files are read when the settings are made (the data path's ``ssl`` contexts load the certificate
and key files once more, when first made): a missing or unreadable file, a key that does not match
its certificate, or an encrypted key (servers start unattended: no passphrase prompts) is a
ValueError naming the file. The key's bytes are never shown in a repr, and never pickled.

Example::

    >>> server = TlsSettings.for_server("/etc/ds/worker.pem", "/etc/ds/worker.key", client_ca_file=None)
    >>> grpc_server.add_secure_port("[::]:5051", server.server_credentials())
    >>> client = TlsSettings.resolve(ca_file="/etc/ds/ca.pem")    # None when no CA is given or set
    >>> channel = grpc.secure_channel("worker1:5051", client.channel_credentials())
    >>> tls_sock = client.client_context().wrap_socket(sock, server_hostname="worker1")
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import ssl
from typing import Optional

import grpc

__all__ = ["TlsSettings", "TLS_CA_ENV", "TLS_CERT_ENV", "TLS_KEY_ENV", "FIX_CA", "probe_tls", "describe_tls_failure",
           "grpc_handshake_error", "is_tls_record"]

TLS_CA_ENV = "DATASERVICE_TLS_CA"
TLS_CERT_ENV = "DATASERVICE_TLS_CERT"
TLS_KEY_ENV = "DATASERVICE_TLS_KEY"
#: How to give a client the cluster's CA; said in every message about a client without it.
FIX_CA = (f"pass tls_ca= (or set {TLS_CA_ENV}; --tls-ca on the command line) to the CA file that signed the "
          f"cluster's certificates")
_FIX_CLIENT_CERT = (f"pass tls_cert= and tls_key= (or set "
                    f"{TLS_CERT_ENV} and {TLS_KEY_ENV}; --tls-cert/--tls-key on the command line) to a certificate "
                    f"signed by the CA the servers trust (their --tls-client-ca)")


def _read(path: str, what: str) -> bytes:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} must be the path of a PEM file, got {path!r}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN" not in data:
        raise ValueError(f"the {what} file {path} is not a PEM file (no '-----BEGIN' line)")
    return data


def _no_passphrase() -> str:
    raise ValueError("encrypted")


def _check_pair(cert_file: str, key_file: str) -> None:
    """ValueError unless ``key_file`` is the unencrypted key of ``cert_file``."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except ValueError:
        raise ValueError(f"the TLS key file {key_file} is encrypted: give an unencrypted key (e.g. `openssl pkey "
                         f"-in {key_file} -out plain.key`), readable by this process only") from None
    except ssl.SSLError as exc:
        raise ValueError(f"the TLS key file {key_file} does not belong to the certificate {cert_file} (or one of "
                         f"them is not valid PEM): {exc.reason or exc}") from None


@dataclasses.dataclass(frozen=True)
class TlsSettings:
    """One process's TLS files and their contents; see the module docstring.

    A server uses ``cert_file``/``key_file`` (and ``client_ca_file`` for mutual TLS); a client
    uses ``ca_file`` (and ``cert_file``/``key_file`` to present under mutual TLS).
    """

    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    client_ca_file: Optional[str] = None
    ca: Optional[bytes] = dataclasses.field(default=None, init=False, repr=False, compare=False)
    cert: Optional[bytes] = dataclasses.field(default=None, init=False, repr=False, compare=False)
    key: Optional[bytes] = dataclasses.field(default=None, init=False, repr=False, compare=False)
    client_ca: Optional[bytes] = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = ("certificate", "key") if self.key_file is None else ("key", "certificate")
            raise ValueError(f"a TLS {given} needs its {missing}: give both --tls-cert and --tls-key (tls_cert= and "
                             f"tls_key=), or neither")
        for name, what in (("ca", "TLS CA"), ("cert", "TLS certificate"), ("key", "TLS key"),
                           ("client_ca", "TLS client CA")):
            path = getattr(self, f"{name}_file")
            if path is not None:
                object.__setattr__(self, name, _read(path, what))
        if self.cert_file is not None:
            _check_pair(self.cert_file, self.key_file)

    # --- making settings ---------------------------------------------------------------
    @classmethod
    def for_server(cls, cert_file: Optional[str], key_file: Optional[str], client_ca_file: Optional[str] = None,
                   ca_file: Optional[str] = None) -> Optional["TlsSettings"]:
        """A server's settings (a worker's also carry ``ca_file``, to verify its dispatcher); None without
        a certificate. ValueError for a key without a certificate, or a client CA without either."""
        if cert_file is None and key_file is None:
            if client_ca_file is not None:
                raise ValueError("--tls-client-ca (tls_client_ca=) needs --tls-cert and --tls-key: mutual TLS is "
                                 "TLS whose clients also present certificates")
            return None
        return cls(ca_file=ca_file, cert_file=cert_file, key_file=key_file, client_ca_file=client_ca_file)

    @classmethod
    def resolve(cls, ca_file: Optional[str] = None, cert_file: Optional[str] = None,
                key_file: Optional[str] = None) -> Optional["TlsSettings"]:
        """A client's settings: each argument, else its environment variable (``DATASERVICE_TLS_CA``,
        ``DATASERVICE_TLS_CERT``, ``DATASERVICE_TLS_KEY``); None when no CA is given or set (plaintext).
        ValueError for a certificate without a CA, or an unreadable file."""
        ca_file = ca_file if ca_file is not None else os.environ.get(TLS_CA_ENV) or None
        cert_file = cert_file if cert_file is not None else os.environ.get(TLS_CERT_ENV) or None
        key_file = key_file if key_file is not None else os.environ.get(TLS_KEY_ENV) or None
        if ca_file is None:
            if cert_file is not None or key_file is not None:
                raise ValueError(f"a client TLS certificate (tls_cert=/tls_key=, {TLS_CERT_ENV}/{TLS_KEY_ENV}) "
                                 f"needs the CA to verify the servers with: {FIX_CA}")
            return None
        return cls(ca_file=ca_file, cert_file=cert_file, key_file=key_file)

    @property
    def serves(self) -> bool:
        """Whether these settings can serve TLS (they have a certificate and its key)."""
        return self.cert_file is not None

    def as_client(self) -> Optional["TlsSettings"]:
        """What a server that is also a client (a worker, to its dispatcher) uses: its CA, and its own
        certificate to present under mutual TLS; None without a CA."""
        if self.ca_file is None:
            return None
        return TlsSettings(ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file)

    # --- gRPC ----------------------------------------------------------------------------
    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    # --- the TCP data path -----------------------------------------------------------------
    @functools.cached_property
    def _server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=self.client_ca.decode("ascii"))
        return context

    def server_context(self) -> ssl.SSLContext:
        """For ``wrap_socket(conn, server_side=True)``: our certificate; under mutual TLS, client
        certificates required and verified against the client CA."""
        return self._server_context

    @functools.cached_property
    def _client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=self.ca.decode("ascii"))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
        return context

    def client_context(self) -> ssl.SSLContext:
        """For ``wrap_socket(sock, server_hostname=host)``: verifies the server against the CA and
        checks its host name; presents our certificate when we have one."""
        return self._client_context

    def __getstate__(self) -> dict:  # the paths travel; the key's bytes never do
        return {"ca_file": self.ca_file, "cert_file": self.cert_file, "key_file": self.key_file,
                "client_ca_file": self.client_ca_file}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        self.__post_init__()


def is_tls_record(data: bytes) -> bool:
    """Whether ``data`` starts like a TLS record: content type 21 (alert) or 22 (handshake), version 3.x."""
    return len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03


def grpc_handshake_error(details: str) -> Optional[str]:
    """The TLS error in a failed gRPC call's details ("... Tls handshake failed (TSI_PROTOCOL_FAILURE):
    SSL_ERROR_SSL: error:...:CERTIFICATE_VERIFY_FAILED: ..."), or None if the call did not fail so."""
    if "handshake failed" not in details.lower():
        return None
    error = details.rsplit("SSL_ERROR_SSL:", 1)[-1].strip()
    return error[:-len(": OK")] if error.endswith(": OK") else error


def describe_tls_failure(error: BaseException, address: str) -> str:
    """What a failed TLS handshake (or a TLS alert after it) with ``address`` means, and how to fix it."""
    text = str(error)
    upper = text.upper()
    if "CERTIFICATE_REQUIRED" in upper or "PEER_DID_NOT_RETURN_A_CERTIFICATE" in upper:
        return f"TLS: {address} requires a client certificate, and this client presented none: {_FIX_CLIENT_CERT}"
    if "HOSTNAME MISMATCH" in upper or "IP ADDRESS MISMATCH" in upper or "NOT VALID FOR" in upper \
            or "IS NOT IN PEER CERTIFICATE" in upper:
        return (f"TLS: the certificate of {address} does not name that host ({text}): connect by a name its "
                f"certificate lists in subjectAltName, or reissue it")
    if "CERTIFICATE_VERIFY_FAILED" in upper:
        return (f"TLS: the certificate of {address} is not signed by this client's CA (or has expired): {text}. "
                f"Check tls_ca= / {TLS_CA_ENV} / --tls-ca: it must be the CA that signed the cluster's certificates")
    if any(alert in upper for alert in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN",
                                        "UNSUPPORTED_CERTIFICATE", "CERTIFICATE_EXPIRED")):
        return (f"TLS: {address} refused this client's certificate ({text}): it must be signed by the CA the "
                f"servers trust (their --tls-client-ca), and allow client authentication")
    if "WRONG_VERSION_NUMBER" in upper or "RECORD_LAYER_FAILURE" in upper or "PACKET_LENGTH_TOO_LONG" in upper:
        return (f"TLS: {address} does not speak TLS (it answered in plaintext): this client has a TLS CA (tls_ca=, "
                f"{TLS_CA_ENV}, --tls-ca), but the server runs without TLS; drop the CA, or start the servers with "
                f"--tls-cert and --tls-key (or is {address} not a dataservice server?)")
    return f"TLS: the handshake with {address} failed: {text}"


def probe_tls(address: tuple[str, int], settings: TlsSettings, timeout_s: float = 1.0) -> Optional[str]:
    """Opens one TLS connection to ``address`` (host, port) as a gRPC client would, and says what went
    wrong (``describe_tls_failure``), or None if the server answered (or nobody listens: not a TLS problem).

    Under TLS 1.3 a server checks the client's certificate only after the client finished its side
    of the handshake: OpenSSL then sends an alert, but gRPC's server just closes the connection. So
    the probe sends the HTTP/2 preface, as gRPC does, and a close before any answer means that the
    server refused this client's certificate, or its lack of one.
    """
    from dataservice.service.endpoint_probe import GRPC_CLIENT_OPENING  # endpoint_probe is plain sockets only

    host, port = address
    host = host.strip("[]")
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return None
    try:
        with settings.client_context().wrap_socket(sock, server_hostname=host) as tls:
            tls.settimeout(timeout_s)
            tls.sendall(GRPC_CLIENT_OPENING)
            answer = tls.recv(4096)
    except ssl.SSLError as exc:
        if not isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            return describe_tls_failure(exc, where)
        answer = b""
    except (socket.timeout, TimeoutError):
        return None  # a slow server, not a refusal
    except ConnectionError:
        answer = b""
    except OSError:
        return None
    finally:
        sock.close()
    if answer:
        return None
    if settings.cert is None:
        return (f"TLS: {where} closed the connection right after the TLS handshake: it requires a client "
                f"certificate (mutual TLS), and this client presented none: {_FIX_CLIENT_CERT}")
    return (f"TLS: {where} closed the connection right after the TLS handshake: it refused this client's "
            f"certificate ({settings.cert_file}): it must be signed by the CA the servers trust (their "
            f"--tls-client-ca), and allow client authentication")
