"""Authentication on every service: tokens, TLS (with client certificates), --insecure, `gpuremote run`.

Real daemon and pool processes on loopback ports; a throwaway CA and certificates made here with
`cryptography`. Every process is stopped by its fixture or test; every wait has a timeout.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
import textwrap

import grpc
import pytest

from conftest import DaemonProcess, backend_args
from gpuremote.transport import auth
from gpuremote.v1 import daemon_pb2_grpc, pool_pb2, pool_pb2_grpc
from gpuremote.wire import pb
from test_pool_e2e import PoolProcess, devices

CLI = [sys.executable, "-m", "gpuremote.cli"]


# --- helpers -------------------------------------------------------------------------------

def secret_file(path, secret: str, mode: int = 0o600) -> str:
    path.write_text(secret + "\n")
    path.chmod(mode)
    return str(path)


@pytest.fixture
def token(tmp_path):
    return secret_file(tmp_path / "token", "s3cret-token-for-tests")


@pytest.fixture
def other_token(tmp_path):
    return secret_file(tmp_path / "other", "not-the-right-token")


def info(address: str, security: auth.ClientSecurity | None = None, raw_metadata=None):
    """Daemon.Info over a channel with `security` (plaintext, no token by default)."""
    with auth.channel(address, security or auth.ClientSecurity(), options=[]) as channel:
        return daemon_pb2_grpc.DaemonStub(channel).Info(pb.InfoRequest(), timeout=10, metadata=raw_metadata)


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        call()
    return exc.value.code(), exc.value.details() or ""


def cli(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    """A gpuremote command that must end by itself (a server that starts by mistake fails the test)."""
    try:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`gpuremote {' '.join(args)}` kept running instead of refusing: {exc.stdout!r}")


# --- tokens against a daemon ----------------------------------------------------------------

def test_daemon_requires_the_token(token, other_token, monkeypatch):
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), security=("--token-file", token))
    try:
        code, details = code_of(lambda: info(d.address))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "requires a token" in details and "--token-file" in details
        code, details = code_of(lambda: info(d.address, auth.ClientSecurity.from_options(token_file=other_token)))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "not the one this server accepts" in details
        code, _ = code_of(lambda: info(d.address, raw_metadata=[("authorization", "s3cret-token-for-tests")]))
        assert code == grpc.StatusCode.UNAUTHENTICATED            # the secret without the scheme
        good = auth.ClientSecurity.from_options(token_file=token)
        assert info(d.address, good).devices[0].memory_total == 64 * 2**20

        # The session stream is refused before the daemon opens anything.
        with grpc.insecure_channel(d.address) as channel:
            hello = pb.ClientMessage()
            hello.open.protocol_version = 1
            code, details = code_of(lambda: list(daemon_pb2_grpc.DaemonStub(channel).Session(iter([hello]),
                                                                                           timeout=10)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert not info(d.address, good).sessions

        # The client library reads GPUREMOTE_TOKEN_FILE and says clearly when it is missing.
        import gpuremote
        import gpuremote.cupy as cp
        from gpuremote.errors import AuthenticationError
        gpuremote.disconnect()
        monkeypatch.delenv(auth.TOKEN_FILE_ENV, raising=False)
        with pytest.raises(AuthenticationError, match="refused this client.*requires a token"):
            gpuremote.connect(d.address)
        monkeypatch.setenv(auth.TOKEN_FILE_ENV, token)
        try:
            gpuremote.connect(d.address)
            assert float((cp.arange(4, dtype=cp.float32) * 2).sum()) == 12.0
        finally:
            gpuremote.disconnect()
    finally:
        d.stop()


# --- tokens against a pool ------------------------------------------------------------------

def register_request(name: str = "h0") -> pool_pb2.RegisterRequest:
    return pool_pb2.RegisterRequest(host_id=name, address="127.0.0.1:7200", backend="emulated", devices=devices(1))


def test_pool_requires_the_token_on_every_rpc(tmp_path, token, other_token):
    daemon_token = secret_file(tmp_path / "daemons", "daemons-only-secret")
    pool = PoolProcess(tmp_path / "pool.db", security=("--token-file", token, "--daemon-token-file", daemon_token))
    try:
        assert "token, separate token for 3 method(s)" in pool.output()
        stub = pool.stub                                              # plaintext, no token
        for call in (lambda: stub.Status(pool_pb2.StatusRequest(), timeout=10),
                     lambda: stub.Register(register_request(), timeout=10),
                     lambda: stub.Heartbeat(pool_pb2.HeartbeatRequest(host_id="h0"), timeout=10),
                     lambda: stub.Deregister(pool_pb2.DeregisterRequest(host_id="h0"), timeout=10),
                     lambda: stub.Allocate(pool_pb2.AllocateRequest(count=1, whole=True), timeout=10),
                     lambda: stub.Release(pool_pb2.ReleaseRequest(lease_id="x"), timeout=10)):
            assert code_of(call)[0] == grpc.StatusCode.UNAUTHENTICATED

        def stub_with(path):
            return pool_pb2_grpc.PoolStub(auth.channel(pool.address, auth.ClientSecurity.from_options(
                token_file=path, environ={}), options=[]))

        tenant, daemon, stranger = stub_with(token), stub_with(daemon_token), stub_with(other_token)
        other_tenant = stub_with(token)
        assert tenant.Status(pool_pb2.StatusRequest(), timeout=10).hosts == []
        assert code_of(lambda: stranger.Status(pool_pb2.StatusRequest(), timeout=10))[0] == \
            grpc.StatusCode.UNAUTHENTICATED
        # Tenants cannot register (which would hand them the grant key) or deregister a host; daemons can.
        code, details = code_of(lambda: tenant.Register(register_request(), timeout=10))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "--daemon-token-file" in details
        code, details = code_of(lambda: tenant.Deregister(pool_pb2.DeregisterRequest(host_id="h0"), timeout=10))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "--daemon-token-file" in details
        assert len(daemon.Register(register_request(), timeout=10).grant_key) == 32
        assert daemon.Heartbeat(pool_pb2.HeartbeatRequest(host_id="h0", devices=devices(1)), timeout=10).known
        lease = tenant.Allocate(pool_pb2.AllocateRequest(count=1, whole=True), timeout=10)
        # Another tenant with the same token sees the lease id but cannot release the lease.
        (seen,) = other_tenant.Status(pool_pb2.StatusRequest(), timeout=10).leases
        code, details = code_of(lambda: other_tenant.Release(pool_pb2.ReleaseRequest(lease_id=seen.lease_id),
                                                             timeout=10))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "lease secret is missing or wrong" in details
        tenant.Release(pool_pb2.ReleaseRequest(lease_id=lease.lease_id, lease_secret=lease.lease_secret), timeout=10)
        assert daemon.Deregister(pool_pb2.DeregisterRequest(host_id="h0"), timeout=10).known
        assert tenant.Status(pool_pb2.StatusRequest(), timeout=10).hosts == []
    finally:
        pool.stop()


# --- refusing to start ----------------------------------------------------------------------

@pytest.mark.parametrize("command", ["daemon", "pool", "run"])
@pytest.mark.parametrize("problem", ["group-readable", "empty", "missing"])
def test_bad_token_files_are_refused(command, problem, tmp_path):
    path = tmp_path / "token"
    if problem == "group-readable":
        secret_file(path, "a-secret", mode=0o640)
    elif problem == "empty":
        secret_file(path, "  \n ")
    args = {"daemon": ["daemon", "--listen", "127.0.0.1:0", "--backend", "emulated"],
            "pool": ["pool", "--listen", "127.0.0.1:0", "--state", str(tmp_path / "pool.db")],
            "run": ["run", "--daemon", "127.0.0.1:9"]}[command]
    if command == "run":        # run takes it from the environment too
        result = cli(*args, "--", "true", env={auth.TOKEN_FILE_ENV: str(path)})
    else:
        result = cli(*args, "--token-file", str(path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "listening" not in result.stdout and "Traceback" not in result.stderr
    hint = {"group-readable": f"chmod 600 {path}", "empty": "is empty", "missing": "cannot read token file"}[problem]
    assert hint in result.stderr and "--token-file" in result.stderr, result.stderr


def test_the_secret_never_goes_on_the_command_line():
    result = cli("daemon", "--token", "s3cret", "--backend", "emulated")
    assert result.returncode == 2 and "No such option '--token'" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["daemon", "pool"])
def test_servers_refuse_to_start_unauthenticated(command, tmp_path):
    extra = ["--backend", "emulated"] if command == "daemon" else ["--state", str(tmp_path / "pool.db")]
    result = cli(command, "--listen", "127.0.0.1:0", *extra, env={auth.TOKEN_FILE_ENV: ""})
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "refusing to serve without authentication" in result.stderr
    assert "--token-file" in result.stderr and "--insecure" in result.stderr
    assert "listening" not in result.stdout


@pytest.mark.parametrize("command", ["daemon", "pool"])
@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "192.0.2.1:7200"])
def test_insecure_stays_on_loopback(command, listen, tmp_path):
    extra = ["--backend", "emulated"] if command == "daemon" else ["--state", str(tmp_path / "pool.db")]
    result = cli(command, "--insecure", "--listen", listen, *extra)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "listens only on loopback" in result.stderr and "--insecure-listen-anywhere" in result.stderr


def test_insecure_listen_anywhere_is_explicit():
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), "--listen", "0.0.0.0:0",
                      security=("--insecure", "--insecure-listen-anywhere"))
    try:
        assert d.address.startswith("0.0.0.0:")
        assert info("127.0.0.1:" + d.address.rpartition(":")[2]).backend
    finally:
        d.stop()


@pytest.mark.parametrize("args,hint", [
    (["--insecure", "--token-file", "TOKEN"], "drop one or the other"),
    (["--insecure-listen-anywhere", "--token-file", "TOKEN"], "only applies with --insecure"),
    (["--tls-cert", "TOKEN"], "--tls-cert and --tls-key together"),
    (["--token-file", "TOKEN", "--tls-client-ca", "TOKEN"], "needs TLS"),
])
def test_contradicting_server_flags(args, hint, token):
    result = cli("daemon", "--listen", "127.0.0.1:0", "--backend", "emulated",
                 *[token if a == "TOKEN" else a for a in args])
    assert result.returncode == 2 and hint in result.stderr, result.stderr


def test_loopback_addresses():
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert auth.is_loopback(host), host
    for host in ("0.0.0.0", "[::]", "::", "10.0.0.1", "192.0.2.1", "example.com", ""):
        assert not auth.is_loopback(host), host


# --- TLS -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA; a server certificate for 127.0.0.1/localhost; a client certificate; and a
    client certificate from another CA. Returns a dict of PEM file paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    root = tmp_path_factory.mktemp("pki")
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def make(cn, issuer=None, ca=False, san=None, usage=None):
        key = ec.generate_private_key(ec.SECP256R1())
        issuer_cert, issuer_key = issuer if issuer else (None, key)
        b = (x509.CertificateBuilder().subject_name(name(cn))
             .issuer_name(issuer_cert.subject if issuer_cert else name(cn))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        if usage:
            b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return b.sign(issuer_key, hashes.SHA256()), key

    def save(stem, cert, key):
        (root / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k = root / f"{stem}.key"
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        k.chmod(0o600)

    ca = make("gpuremote test CA", ca=True)
    rogue = make("someone else's CA", ca=True)
    save("ca", *ca)
    save("server", *make("gpuremote daemon", ca, san=[x509.DNSName("localhost"),
                                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                         usage=ExtendedKeyUsageOID.SERVER_AUTH))
    save("client", *make("tenant", ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH))
    save("rogue", *make("intruder", rogue, usage=ExtendedKeyUsageOID.CLIENT_AUTH))
    return {p.stem + ("_key" if p.suffix == ".key" else ""): str(p) for p in root.iterdir()}


def test_tls_with_token(pki, token, monkeypatch):
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"),
                      security=("--tls-cert", pki["server"], "--tls-key", pki["server_key"], "--token-file", token))
    try:
        good = auth.ClientSecurity.from_options(token_file=token, tls_ca=pki["ca"], environ={})
        assert info(d.address, good).backend
        # A plaintext client cannot talk to it, token or not.
        code, _ = code_of(lambda: info(d.address, auth.ClientSecurity.from_options(token_file=token, environ={})))
        assert code == grpc.StatusCode.UNAVAILABLE
        # TLS alone is not enough: the token is still required (sent as call credentials over TLS).
        code, details = code_of(lambda: info(d.address, auth.ClientSecurity.from_options(tls_ca=pki["ca"],
                                                                                         environ={})))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "requires a token" in details
        # A client that trusts another CA refuses the server.
        code, _ = code_of(lambda: info(d.address, auth.ClientSecurity.from_options(
            token_file=token, tls_ca=pki["rogue"], environ={})))
        assert code == grpc.StatusCode.UNAVAILABLE

        # The client library takes both from the environment.
        import gpuremote
        import gpuremote.cupy as cp
        gpuremote.disconnect()
        monkeypatch.setenv(auth.TOKEN_FILE_ENV, token)
        monkeypatch.setenv(auth.TLS_CA_ENV, pki["ca"])
        try:
            gpuremote.connect(d.address)
            assert int(cp.ones(5, dtype=cp.int32).sum()) == 5
        finally:
            gpuremote.disconnect()
    finally:
        d.stop()


def test_tls_client_certificates(pki, tmp_path):
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"),
                      security=("--tls-cert", pki["server"], "--tls-key", pki["server_key"],
                                "--tls-client-ca", pki["ca"]))
    pool = PoolProcess(tmp_path / "pool.db", security=("--tls-cert", pki["server"], "--tls-key", pki["server_key"],
                                                       "--tls-client-ca", pki["ca"]))
    try:
        with_cert = auth.ClientSecurity.from_options(tls_ca=pki["ca"], tls_cert=pki["client"],
                                                     tls_key=pki["client_key"], environ={})
        without_cert = auth.ClientSecurity.from_options(tls_ca=pki["ca"], environ={})
        foreign_cert = auth.ClientSecurity.from_options(tls_ca=pki["ca"], tls_cert=pki["rogue"],
                                                        tls_key=pki["rogue_key"], environ={})
        assert info(d.address, with_cert).backend
        for security in (without_cert, foreign_cert, auth.ClientSecurity()):
            assert code_of(lambda: info(d.address, security))[0] == grpc.StatusCode.UNAVAILABLE

        def status(security):
            with auth.channel(pool.address, security, options=[]) as channel:
                return pool_pb2_grpc.PoolStub(channel).Status(pool_pb2.StatusRequest(), timeout=10)
        assert status(with_cert).hosts == []
        assert code_of(lambda: status(without_cert))[0] == grpc.StatusCode.UNAVAILABLE
    finally:
        pool.stop()
        d.stop()


# --- gpuremote run ------------------------------------------------------------------------

CHILD = """
    import os, sys
    import cupy
    path = os.environ.get("GPUREMOTE_TOKEN_FILE", "")
    secret = open(path).read().strip() if path else ""
    assert secret and all(secret not in v for v in os.environ.values()), "the secret itself is in the environment"
    print("sum", int(cupy.arange(10).sum()), "tls", os.environ.get("GPUREMOTE_TLS_CA", "-") != "-")
"""


def run_child(tmp_path, *options, env=None):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUREMOTE_TLS", "GPUREMOTE_TOKEN",
                                                                          "GPUREMOTE_DAEMON"))}
    full_env.update(env or {})
    return subprocess.run([*CLI, "run", *options, "--", sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120, env=full_env)


def test_run_passes_the_token_file_to_its_child(token, pki, tmp_path):
    d = DaemonProcess(*backend_args(devices=1, memory="64MiB"), security=("--token-file", token))
    t = DaemonProcess(*backend_args(devices=1, memory="64MiB"),
                      security=("--tls-cert", pki["server"], "--tls-key", pki["server_key"], "--token-file", token))
    try:
        got = run_child(tmp_path, "--token-file", token, "--daemon", d.address)
        assert got.returncode == 0 and "sum 45 tls False" in got.stdout, got.stderr
        got = run_child(tmp_path, "--daemon", d.address)            # no token: refused up front
        assert got.returncode == 1 and "refused this client" in got.stderr and "--token-file" in got.stderr
        got = run_child(tmp_path, "--tls-ca", pki["ca"], "--daemon", t.address,
                        env={auth.TOKEN_FILE_ENV: token})           # token from the environment, TLS by flag
        assert got.returncode == 0 and "sum 45 tls True" in got.stdout, got.stderr
    finally:
        t.stop()
        d.stop()


def test_run_local_embedded_daemon_uses_a_private_token(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import os, stat, grpc
        import cupy
        from gpuremote.v1 import daemon_pb2_grpc
        from gpuremote.wire import pb
        assert int(cupy.arange(4).sum()) == 6
        path = os.environ["GPUREMOTE_TOKEN_FILE"]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        address = os.environ["GPUREMOTE_DEVICES"].split("/")[0]
        with grpc.insecure_channel(address) as channel:
            try:
                daemon_pb2_grpc.DaemonStub(channel).Info(pb.InfoRequest(), timeout=10)
            except grpc.RpcError as exc:
                print("without token:", exc.code().name)
        print("token file:", path)
    """))
    got = subprocess.run([*CLI, "run", "--local", "--", sys.executable, str(script)], capture_output=True,
                         text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith("GPUREMOTE_TOKEN")})
    assert got.returncode == 0, got.stderr
    assert "without token: UNAUTHENTICATED" in got.stdout
    path = got.stdout.split("token file:")[1].strip()
    assert not os.path.exists(path)                                  # removed when the run ended


# --- the pieces, in process ---------------------------------------------------------------

def test_token_file_rules(tmp_path):
    assert auth.load_token(secret_file(tmp_path / "a", "  \t spaced-secret \n\n")) == "spaced-secret"
    for content, hint in (("two words", "printable ASCII without spaces"), ("caf\u00e9", "printable ASCII")):
        path = secret_file(tmp_path / "b", content)
        with pytest.raises(auth.AuthConfigError, match=hint):
            auth.load_token(path)
    path = secret_file(tmp_path / "c", "x" * (auth.MAX_TOKEN_BYTES + 1))
    with pytest.raises(auth.AuthConfigError, match="larger than"):
        auth.load_token(path)
    with pytest.raises(auth.AuthConfigError, match="Is a directory|not a regular file"):
        auth.load_token(str(tmp_path))
    ephemeral = auth.EphemeralToken()
    try:
        assert auth.load_token(ephemeral.path) == ephemeral.token
        assert oct(os.stat(ephemeral.directory).st_mode & 0o777) == "0o700"
    finally:
        ephemeral.remove()
    assert not os.path.exists(ephemeral.directory)


def test_secrets_stay_out_of_reprs_and_environments(token):
    client = auth.ClientSecurity.from_options(token_file=token, environ={})
    server = auth.ServerSecurity.from_options(token_file=token)
    for text in (repr(client), repr(server), str(client.env())):
        assert "s3cret" not in text
    assert client.env()[auth.TOKEN_FILE_ENV] == os.path.abspath(token)


def test_security_options_on_a_new_command(token):
    import click
    from click.testing import CliRunner

    from gpuremote.cli_security import security_options

    @click.command()
    @click.option("--listen", default="127.0.0.1:0")
    @security_options("server")
    def serve(listen, security):
        click.echo(f"{listen} {security.describe()}")

    @click.command()
    @security_options()
    def connect(security):
        click.echo(f"token={security.token is not None} tls={security.tls}")

    runner = CliRunner()
    assert runner.invoke(serve, ["--token-file", token]).output.strip() == "127.0.0.1:0 token"
    refused = runner.invoke(serve, ["--insecure", "--listen", "10.1.2.3:7200"])
    assert refused.exit_code == 2 and "loopback" in refused.output
    assert runner.invoke(connect, [], env={auth.TOKEN_FILE_ENV: token}).output.strip() == "token=True tls=False"
    assert runner.invoke(connect, ["--tls-cert", token]).exit_code == 2          # a certificate needs its key
