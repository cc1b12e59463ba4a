"""`security_options`: the authentication and TLS flags of every command that serves or connects.

One line gives a command its flags and one validated `security` argument in their place:

    @security_options("server")     # daemon, pool: ServerSecurity (token and/or TLS, or --insecure)
    @security_options()             # run, smi, bench, ...: ClientSecurity (flags, else environment)

Bad settings (a token file readable by others, an empty one, a missing certificate, a server
with no authentication and no --insecure, --insecure on a non-loopback --listen) end the
command with exit status 2 and a message that says what to do. A server command's `listen`
argument, when it has one, is checked here as well. See gpuremote/transport/auth.py.
"""

from __future__ import annotations

import functools

import click

from gpuremote.transport import auth

_PEM = click.Path(dir_okay=False)


def _server_options():
    return [
        click.option("--token-file", metavar="FILE", envvar=auth.TOKEN_FILE_ENV, show_envvar=True,
                     help="Require clients to present the secret in FILE (mode 600; the secret never goes on "
                          "the command line)."),
        click.option("--tls-cert", type=_PEM, metavar="FILE", help="Serve TLS with this certificate chain (PEM)."),
        click.option("--tls-key", type=_PEM, metavar="FILE", help="The private key of --tls-cert (PEM)."),
        click.option("--tls-client-ca", type=_PEM, metavar="FILE",
                     help="Require client certificates signed by this CA (PEM)."),
        click.option("--insecure", is_flag=True,
                     help="Serve without authentication (loopback addresses only): anyone who reaches the port "
                          "can use it."),
        click.option("--insecure-listen-anywhere", is_flag=True,
                     help="With --insecure, allow a non-loopback --listen address (trusted networks only)."),
    ]


def _client_options():
    return [
        click.option("--token-file", metavar="FILE", envvar=auth.TOKEN_FILE_ENV, show_envvar=True,
                     help="Present the secret in FILE (mode 600) to daemons and pools."),
        click.option("--tls-ca", type=_PEM, metavar="FILE", envvar=auth.TLS_CA_ENV, show_envvar=True,
                     help="Connect with TLS, trusting servers whose certificate this CA signed (PEM)."),
        click.option("--tls-cert", type=_PEM, metavar="FILE", envvar=auth.TLS_CERT_ENV, show_envvar=True,
                     help="Client certificate (PEM), for servers that require one."),
        click.option("--tls-key", type=_PEM, metavar="FILE", envvar=auth.TLS_KEY_ENV, show_envvar=True,
                     help="Private key of --tls-cert (PEM)."),
    ]


_SERVER_NAMES = ("token_file", "tls_cert", "tls_key", "tls_client_ca", "insecure", "insecure_listen_anywhere")
_CLIENT_NAMES = ("token_file", "tls_ca", "tls_cert", "tls_key")


def _fail(exc: auth.AuthConfigError):
    if exc.option:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    raise click.UsageError(str(exc)) from None


def security_options(role: str = "client"):
    """Click decorator: add the security flags of a `role` ("server" or "client") command and call
    it with `security=` (auth.ServerSecurity or auth.ClientSecurity) instead of the flags."""
    if role not in ("server", "client"):
        raise ValueError(f"role must be 'server' or 'client', not {role!r}")
    server = role == "server"
    names = _SERVER_NAMES if server else _CLIENT_NAMES

    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            given = {name: kwargs.pop(name, None) for name in names}
            try:
                if server:
                    given = {k: (bool(v) if k.startswith("insecure") else v) for k, v in given.items()}
                    security = auth.ServerSecurity.from_options(**given)
                    if isinstance(kwargs.get("listen"), str):
                        security.check_listen(kwargs["listen"])
                    warning = security.warning()
                    if warning:
                        click.echo(f"warning: {warning}", err=True)
                else:
                    security = auth.ClientSecurity.from_options(**given)
            except auth.AuthConfigError as exc:
                _fail(exc)
            return f(*args, security=security, **kwargs)

        wrapper.__click_params__ = list(getattr(f, "__click_params__", []))
        for option in reversed(_server_options() if server else _client_options()):
            wrapper = option(wrapper)
        return wrapper

    return decorate
