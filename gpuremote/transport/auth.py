"""Authentication and encryption of every gRPC service: shared-secret tokens and TLS.

Server side (`ServerSecurity`): a token file makes the server require
`authorization: Bearer <token>` on every call (checked by `TokenInterceptor` with a
constant-time comparison, before any handler runs or any request byte is decoded); TLS
certificates make it serve TLS (`server_credentials`), and a client CA makes it demand a
client certificate signed by that CA. With neither, a server runs only when told `--insecure`,
and then only on loopback unless told `--insecure-listen-anywhere` too (`check_listen`).

Client side (`ClientSecurity`, `channel`): the token travels as call metadata, as call
credentials over TLS or through a client interceptor over plaintext. A client with no
explicit settings reads GPUREMOTE_TOKEN_FILE, GPUREMOTE_TLS_CA, GPUREMOTE_TLS_CERT,
GPUREMOTE_TLS_KEY (and GPUREMOTE_TLS_SERVER_NAME) from the environment; these hold file
paths, never secrets, so `gpuremote run` can hand them to its child.

A token file must not be readable or writable by group or others, must not be empty, and is
stripped of surrounding whitespace; the token must be printable ASCII without spaces (it
travels in an HTTP/2 header).
"""

from __future__ import annotations

import collections
import dataclasses
import hmac
import ipaddress
import logging
import os
import secrets
import shutil
import stat
import tempfile
from typing import Mapping

import grpc

from gpuremote.errors import GpuremoteError

log = logging.getLogger("gpuremote.auth")

TOKEN_FILE_ENV = "GPUREMOTE_TOKEN_FILE"
TLS_CA_ENV = "GPUREMOTE_TLS_CA"
TLS_CERT_ENV = "GPUREMOTE_TLS_CERT"
TLS_KEY_ENV = "GPUREMOTE_TLS_KEY"
TLS_SERVER_NAME_ENV = "GPUREMOTE_TLS_SERVER_NAME"
CLIENT_ENV = (TOKEN_FILE_ENV, TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TLS_SERVER_NAME_ENV)

METADATA_KEY = "authorization"
SCHEME = "Bearer "
# Far above any sensible secret, small enough that a mistaken path (a disk image) is not read whole.
MAX_TOKEN_BYTES = 4096
MAX_PEM_BYTES = 1 << 20

_MAKE_TOKEN = "(umask 077 && python -c 'import secrets; print(secrets.token_urlsafe(32))' > {0})"


class AuthConfigError(GpuremoteError, ValueError):
    """The security settings cannot be used (unreadable or unsafe token file, missing TLS file,
    contradicting options); the message says what to do. `option` names the flag at fault."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option


# --- files ------------------------------------------------------------------------------

def _read_limited(path: str, limit: int, what: str, option: str | None) -> bytes:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise AuthConfigError(f"{what} {path} is not a regular file", option)
            data = f.read(limit + 1)
    except OSError as exc:
        raise AuthConfigError(f"cannot read {what} {path}: {exc.strerror or exc}", option) from None
    if len(data) > limit:
        raise AuthConfigError(f"{what} {path} is larger than {limit:,} bytes: is it the right file?", option)
    return data


def load_token(path: str, option: str | None = "--token-file") -> str:
    """The token in file `path`, or AuthConfigError saying what is wrong and how to fix it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise AuthConfigError(f"cannot read token file {path}: {exc.strerror or exc}; create one with "
                              f"{_MAKE_TOKEN.format(path)}", option) from None
    if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
        raise AuthConfigError(f"token file {path} is accessible by group or others (mode "
                              f"{stat.S_IMODE(st.st_mode):03o}); a shared secret must be private to its owner: "
                              f"chmod 600 {path}", option)
    data = _read_limited(path, MAX_TOKEN_BYTES, "token file", option)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        token = None
    if token == "":
        raise AuthConfigError(f"token file {path} is empty: put a secret in it, e.g. {_MAKE_TOKEN.format(path)}",
                              option)
    if token is None or not all(0x21 <= ord(c) <= 0x7e for c in token):
        raise AuthConfigError(f"the token in {path} must be printable ASCII without spaces (it travels in a "
                              f"header); make one with {_MAKE_TOKEN.format(path)}", option)
    return token


def read_pem(path: str, what: str, option: str | None = None) -> bytes:
    """The bytes of a PEM file (certificate, key or CA bundle), or AuthConfigError."""
    data = _read_limited(path, MAX_PEM_BYTES, what, option)
    if b"-----BEGIN " not in data:
        raise AuthConfigError(f"{what} {path} is not a PEM file (no '-----BEGIN' line)", option)
    return data


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost (brackets around IPv6 allowed)."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- server side ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ServerSecurity:
    """How a server authenticates: token and/or TLS, or explicitly nothing (`insecure`)."""

    token: str | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    tls_client_ca: bytes | None = None
    insecure: bool = False
    listen_anywhere: bool = False
    # Full method name ("/gpuremote.v1.Pool/Register") -> the token it requires instead of `token`:
    # the pool's daemon-facing RPCs can demand a secret that tenants do not hold.
    method_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:          # never print the secret
        return (f"ServerSecurity(token={'<set>' if self.token else None}, tls={self.tls}, "
                f"method_tokens={sorted(self.method_tokens)}, "
                f"client_auth={self.client_auth}, insecure={self.insecure}, listen_anywhere={self.listen_anywhere})")

    @classmethod
    def loopback_insecure(cls) -> "ServerSecurity":
        """No authentication, loopback only: the default of in-process servers (tests, benchmarks)."""
        return cls(insecure=True)

    @classmethod
    def from_options(cls, token_file: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
                     tls_client_ca: str | None = None, insecure: bool = False,
                     insecure_listen_anywhere: bool = False) -> "ServerSecurity":
        """Validate and load a server's settings (the flags of `security_options("server")`)."""
        if bool(tls_cert) != bool(tls_key):
            raise AuthConfigError("give --tls-cert and --tls-key together: the server's certificate chain and its "
                                  "private key", "--tls-key" if tls_cert else "--tls-cert")
        if tls_client_ca and not tls_cert:
            raise AuthConfigError("--tls-client-ca checks client certificates, which needs TLS: give --tls-cert and "
                                  "--tls-key too", "--tls-client-ca")
        if insecure_listen_anywhere and not insecure:
            raise AuthConfigError("--insecure-listen-anywhere only applies with --insecure",
                                  "--insecure-listen-anywhere")
        if insecure and (token_file or tls_cert):
            raise AuthConfigError("--insecure serves without authentication, but a token file (--token-file or "
                                  f"{TOKEN_FILE_ENV}) or TLS (--tls-cert) is given too: drop one or the other",
                                  "--insecure")
        if not (insecure or token_file or tls_cert):
            raise AuthConfigError(
                "refusing to serve without authentication: give --token-file FILE (a shared secret that clients "
                f"present too; chmod 600 FILE; or set {TOKEN_FILE_ENV}) and/or --tls-cert FILE --tls-key FILE "
                "[--tls-client-ca FILE], or --insecure to serve unauthenticated on loopback only "
                "(see SECURITY.md)")
        return cls(token=load_token(token_file) if token_file else None,
                   tls_cert=read_pem(tls_cert, "TLS certificate", "--tls-cert") if tls_cert else None,
                   tls_key=read_pem(tls_key, "TLS private key", "--tls-key") if tls_key else None,
                   tls_client_ca=read_pem(tls_client_ca, "TLS client CA", "--tls-client-ca") if tls_client_ca else None,
                   insecure=insecure, listen_anywhere=insecure_listen_anywhere)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def client_auth(self) -> bool:
        return self.tls_client_ca is not None

    @property
    def authenticates(self) -> bool:
        """Whether clients must prove who they are (token or client certificate)."""
        return self.token is not None or self.client_auth

    def requiring(self, methods, token: str) -> "ServerSecurity":
        """A copy in which `methods` (full names) require `token` instead of the server's token."""
        return dataclasses.replace(self, method_tokens={**self.method_tokens, **{m: token for m in methods}})

    def describe(self) -> str:
        """One phrase for the start-up line, e.g. 'token, TLS with client certificates'."""
        parts = (["token"] if self.token else []) + (
            ["TLS with client certificates" if self.client_auth else "TLS"] if self.tls else [])
        if self.method_tokens:
            parts.append(f"separate token for {len(self.method_tokens)} method(s)")
        return ", ".join(parts) or "INSECURE: no authentication"

    def warning(self) -> str | None:
        """What an operator should know about this configuration, or None."""
        if self.tls and not self.authenticates:
            return ("TLS without --token-file or --tls-client-ca encrypts the traffic but lets any client that can "
                    "reach the port in")
        if self.insecure and self.listen_anywhere:
            return ("--insecure-listen-anywhere: anyone who can reach this port can use the service; serve it "
                    "only on a network where every peer is trusted")
        return None

    def check_listen(self, listen: str) -> None:
        """AuthConfigError unless `listen` (HOST:PORT) is allowed: insecure servers stay on loopback."""
        if not self.insecure or self.listen_anywhere:
            return
        host = listen.rpartition(":")[0]
        if not is_loopback(host):
            raise AuthConfigError(
                f"--insecure serves without authentication, so it listens only on loopback (127.0.0.1, ::1, "
                f"localhost), not on {host or listen}: protect the service with --token-file FILE and/or "
                "--tls-cert FILE --tls-key FILE, or, on a network where every peer is trusted, add "
                "--insecure-listen-anywhere", "--insecure")


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call that lacks `authorization: Bearer <token>`.

    The refusal replaces the method's handler, so the service's code never runs and the
    request's bytes are never decoded for an unauthenticated caller.
    """

    def __init__(self, token: str | None, method_tokens: Mapping[str, str] | None = None):
        self._expected = (SCHEME + token).encode("ascii") if token else None
        self._by_method = {m: (SCHEME + t).encode("ascii") for m, t in (method_tokens or {}).items()}

    def _authorized(self, metadata, expected: bytes) -> bool:
        presented = None
        for key, value in metadata or ():
            if key == METADATA_KEY:
                presented = value
                break
        if presented is None:
            return False
        if isinstance(presented, str):
            try:
                presented = presented.encode("ascii")
            except UnicodeEncodeError:
                return False
        return hmac.compare_digest(presented, expected)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        expected = self._by_method.get(handler_call_details.method, self._expected)
        if handler is None or expected is None or self._authorized(handler_call_details.invocation_metadata,
                                                                   expected):
            return handler
        sent = any(k == METADATA_KEY for k, _ in handler_call_details.invocation_metadata or ())
        message = (("the token this client presented is not the one this server accepts: give the client the "
                    "server's token file") if sent else
                   "this gpuremote server requires a token and the client presented none: give the client the "
                   "server's token file") + f" (--token-file FILE or {TOKEN_FILE_ENV}=FILE)"
        method = handler_call_details.method
        if method in self._by_method:
            message = (f"{method} is reserved to the servers registered here: it requires their separate token "
                       f"(the pool's --daemon-token-file), and the client presented {'another' if sent else 'none'}")

        def refuse(request_or_iterator, context):
            log.warning("refused %s from %s: %s", method, context.peer(),
                        "wrong token" if sent else "no token")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        make = {(False, False): grpc.unary_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}[
            (bool(handler.request_streaming), bool(handler.response_streaming))]
        # No deserializer: the request stays raw bytes, never parsed for an unauthenticated caller.
        return make(refuse)


def server_credentials(security: ServerSecurity | None) -> grpc.ServerCredentials | None:
    """gRPC's SSL server credentials for `security`, or None for plaintext."""
    if security is None or not security.tls:
        return None
    return grpc.ssl_server_credentials([(security.tls_key, security.tls_cert)],
                                       root_certificates=security.tls_client_ca,
                                       require_client_auth=security.client_auth)


def server_interceptors(security: ServerSecurity | None) -> list[grpc.ServerInterceptor]:
    """The interceptors to pass to grpc.server(...): the token check when a token is set."""
    if security is None or not (security.token or security.method_tokens):
        return []
    return [TokenInterceptor(security.token, security.method_tokens)]


def add_port(server: grpc.Server, listen: str, security: ServerSecurity | None) -> int:
    """Bind `listen` with TLS or plaintext as `security` says (None: insecure, loopback only);
    returns the port (0 when it could not bind). AuthConfigError for an insecure non-loopback address."""
    security = security if security is not None else ServerSecurity.loopback_insecure()
    security.check_listen(listen)
    credentials = server_credentials(security)
    if credentials is None:
        return server.add_insecure_port(listen)
    return server.add_secure_port(listen, credentials)


# --- client side ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: a token and/or TLS settings. Paths are kept to hand to children."""

    token: str | None = None
    tls_ca: bytes | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    server_name: str | None = None
    token_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __repr__(self) -> str:
        return (f"ClientSecurity(token={'<set>' if self.token else None}, tls={self.tls}, "
                f"client_cert={self.tls_cert is not None}, server_name={self.server_name!r})")

    @classmethod
    def from_options(cls, token_file: str | None = None, tls_ca: str | None = None, tls_cert: str | None = None,
                     tls_key: str | None = None, server_name: str | None = None,
                     environ: Mapping[str, str] | None = None) -> "ClientSecurity":
        """Explicit settings, each falling back to its environment variable (empty counts as unset)."""
        env = os.environ if environ is None else environ
        token_file = token_file or env.get(TOKEN_FILE_ENV) or None
        tls_ca = tls_ca or env.get(TLS_CA_ENV) or None
        tls_cert = tls_cert or env.get(TLS_CERT_ENV) or None
        tls_key = tls_key or env.get(TLS_KEY_ENV) or None
        server_name = server_name or env.get(TLS_SERVER_NAME_ENV) or None
        if bool(tls_cert) != bool(tls_key):
            raise AuthConfigError(f"a client certificate needs its key: give --tls-cert and --tls-key together "
                                  f"({TLS_CERT_ENV} and {TLS_KEY_ENV})", "--tls-key" if tls_cert else "--tls-cert")
        return cls(token=load_token(token_file) if token_file else None,
                   tls_ca=read_pem(tls_ca, "TLS CA file", "--tls-ca") if tls_ca else None,
                   tls_cert=read_pem(tls_cert, "TLS client certificate", "--tls-cert") if tls_cert else None,
                   tls_key=read_pem(tls_key, "TLS client key", "--tls-key") if tls_key else None,
                   server_name=server_name,
                   token_file=os.path.abspath(token_file) if token_file else None,
                   tls_ca_file=os.path.abspath(tls_ca) if tls_ca else None,
                   tls_cert_file=os.path.abspath(tls_cert) if tls_cert else None,
                   tls_key_file=os.path.abspath(tls_key) if tls_key else None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ClientSecurity":
        return cls.from_options(environ=environ)

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def env(self) -> dict[str, str | None]:
        """The environment that gives a child process these settings (paths only; None: unset it)."""
        return {TOKEN_FILE_ENV: self.token_file, TLS_CA_ENV: self.tls_ca_file, TLS_CERT_ENV: self.tls_cert_file,
                TLS_KEY_ENV: self.tls_key_file, TLS_SERVER_NAME_ENV: self.server_name}

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """SSL channel credentials, with the token as call credentials; None for plaintext."""
        if not self.tls:
            return None
        credentials = grpc.ssl_channel_credentials(root_certificates=self.tls_ca, private_key=self.tls_key,
                                                   certificate_chain=self.tls_cert)
        if self.token:
            # Sends `authorization: Bearer <token>` on every call of the channel.
            credentials = grpc.composite_channel_credentials(credentials,
                                                             grpc.access_token_call_credentials(self.token))
        return credentials


def update_environ(changes: Mapping[str, str | None], environ=None) -> dict[str, str | None]:
    """Apply `changes` to `environ` (os.environ by default; None removes); returns the previous values."""
    environ = os.environ if environ is None else environ
    previous = {k: environ.get(k) for k in changes}
    for key, value in changes.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return previous


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                          "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call's metadata (plaintext channels; TLS uses call credentials)."""

    def __init__(self, token: str):
        self._entry = (METADATA_KEY, SCHEME + token)

    def _details(self, d):
        metadata = [m for m in (d.metadata or ()) if m[0] != METADATA_KEY] + [self._entry]
        return _CallDetails(d.method, d.timeout, metadata, d.credentials, getattr(d, "wait_for_ready", None),
                            getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def channel(address: str, security: ClientSecurity | None = None, options=None) -> grpc.Channel:
    """A channel to a gpuremote server (daemon or pool) at `address` with `security` (default: from
    the environment, see ClientSecurity.from_env) and gRPC `options` (default: grpc_channel.options())."""
    if security is None:
        security = ClientSecurity.from_env()
    if options is None:
        from gpuremote.transport.grpc_channel import options as default_options
        options = default_options()
    options = list(options)
    credentials = security.channel_credentials()
    if credentials is not None:
        if security.server_name:
            options.append(("grpc.ssl_target_name_override", security.server_name))
        return grpc.secure_channel(address, credentials, options=options)
    ch = grpc.insecure_channel(address, options=options)
    if security.token:
        ch = grpc.intercept_channel(ch, _TokenClientInterceptor(security.token))
    return ch


# --- embedded servers -------------------------------------------------------------------

class EphemeralToken:
    """A random token in a file of a private temporary directory, for a server embedded in a
    process (`gpuremote run --local`): the server requires it, the children read the file."""

    def __init__(self):
        self.token = secrets.token_urlsafe(32)
        self.directory = tempfile.mkdtemp(prefix="gpuremote-token-")   # mode 0700
        self.path = os.path.join(self.directory, "token")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token + "\n")

    def server_security(self) -> ServerSecurity:
        return ServerSecurity(token=self.token)

    def client_env(self) -> dict[str, str | None]:
        """The child's environment for this token: the file, and no TLS (the embedded server is plaintext)."""
        return {TOKEN_FILE_ENV: self.path, TLS_CA_ENV: None, TLS_CERT_ENV: None, TLS_KEY_ENV: None,
                TLS_SERVER_NAME_ENV: None}

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
