"""TLS and mutual TLS on both ports, with certificates made here (a CA, a server certificate for
127.0.0.1, a client certificate, and one from another CA): a client that trusts the CA is
served, a plaintext client or one that does not trust the CA is not, and under mutual TLS
(`--ssl-cert-reqs 2`) neither a client without a certificate nor one whose certificate another
CA signed gets through."""

from __future__ import annotations

import json
import ssl

import grpc
import httpx
import pytest
from certs import Certs, make_certs
from fleets import TEST_FLEET
from ready import wait_ready
from server_proc import ServerProcess

from clients.client import AsyncClient

COMPLETION = {"prompt": "hi", "max_tokens": 3}


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_args(certs: Certs, *extra: str) -> list[str]:
    return ["--ssl-keyfile", str(certs.server_key), "--ssl-certfile", str(certs.server_cert),
            *extra]


@pytest.fixture(scope="module")
def tls_server(certs):
    with ServerProcess(TEST_FLEET, *tls_args(certs)) as s:
        wait_ready(s.target, root_certificates=certs.read("ca"))
        yield s


@pytest.fixture(scope="module")
def mtls_server(certs):
    with ServerProcess(TEST_FLEET, *tls_args(certs, "--ssl-ca-certs", str(certs.ca),
                                             "--ssl-cert-reqs", "2")) as s:
        wait_ready(s.target, root_certificates=certs.read("ca"),
                   private_key=certs.read("client_key"),
                   certificate_chain=certs.read("client_cert"))
        yield s


def https(server: ServerProcess) -> str:
    return f"https://127.0.0.1:{server.http_port}"


def context(certs: Certs, client: str | None = None) -> ssl.SSLContext:
    """Trusts the test CA; presents `client`'s certificate ("client" or "rogue") if given."""
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if client:
        ctx.load_cert_chain(str(getattr(certs, f"{client}_cert")),
                            str(getattr(certs, f"{client}_key")))
    return ctx


async def served(target: str, **security) -> int:
    async with AsyncClient(target, **security) as client:
        names = [d.name for d in (await client.list_deployments(timeout=5)).deployments]
        chunks = [c async for c in client.generate("hi", max_tokens=3, ignore_eos=True,
                                                   timeout=10)]
    assert chunks[-1].HasField("final")
    return len(names)


async def refused(target: str, **security) -> None:
    async with AsyncClient(target, **security) as client:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.list_deployments(timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()


async def http_ok(url: str, verify: ssl.SSLContext) -> None:
    async with httpx.AsyncClient(verify=verify, timeout=10) as http:
        assert (await http.get(f"{url}/health")).status_code == 200
        r = await http.post(f"{url}/v1/completions", json=COMPLETION)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


async def http_fails(url: str, verify: ssl.SSLContext | bool) -> None:
    async with httpx.AsyncClient(verify=verify, timeout=10) as http:
        with pytest.raises(httpx.TransportError):
            await http.get(f"{url}/health")


async def test_grpc_tls(tls_server, certs):
    assert await served(tls_server.target, root_certificates=certs.read("ca")) == 2
    await refused(tls_server.target)  # plaintext
    await refused(tls_server.target, tls=True)  # the system's roots do not know the test CA


async def test_http_tls(tls_server, certs):
    await http_ok(https(tls_server), context(certs))
    await http_fails(f"http://127.0.0.1:{tls_server.http_port}", False)  # plaintext
    await http_fails(https(tls_server), ssl.create_default_context())  # CA not trusted


async def test_the_start_up_line_and_metrics_under_tls(tls_server, certs):
    assert f"listening on 127.0.0.1:{tls_server.port} " in tls_server.log
    async with httpx.AsyncClient(verify=context(certs), timeout=10) as http:
        r = await http.get(f"{https(tls_server)}/metrics")
    assert r.status_code == 200 and "vllm:num_requests_running" in r.text


async def test_grpc_mutual_tls(mtls_server, certs):
    ca = certs.read("ca")
    assert await served(mtls_server.target, root_certificates=ca,
                        private_key=certs.read("client_key"),
                        certificate_chain=certs.read("client_cert")) == 2
    await refused(mtls_server.target, root_certificates=ca)  # no client certificate
    await refused(mtls_server.target, root_certificates=ca, private_key=certs.read("rogue_key"),
                  certificate_chain=certs.read("rogue_cert"))  # signed by another CA
    await refused(mtls_server.target)  # plaintext


async def test_http_mutual_tls(mtls_server, certs):
    await http_ok(https(mtls_server), context(certs, "client"))
    await http_fails(https(mtls_server), context(certs))  # no client certificate
    await http_fails(https(mtls_server), context(certs, "rogue"))
    await http_fails(f"http://127.0.0.1:{mtls_server.http_port}", False)


def test_tls_settings_are_checked(certs):
    from server.config import ConfigError, parse_fleet

    def server(**keys):
        return parse_fleet({**TEST_FLEET, "server": {**TEST_FLEET["server"], **keys}})

    assert server(ssl_keyfile="k", ssl_certfile="c").server.tls
    for bad, words in (({"ssl_keyfile": "k"}, "go together"),
                       ({"ssl_keyfile": "k", "ssl_certfile": "c", "ssl_cert_reqs": 3}, "0"),
                       ({"ssl_keyfile": "k", "ssl_certfile": "c", "ssl_cert_reqs": 2},
                        "needs ssl_ca_certs"),
                       ({"ssl_ca_certs": "ca"}, "need TLS")):
        with pytest.raises(ConfigError, match=words):
            server(**bad)


@pytest.mark.parametrize("case", ["missing", "mismatched"])
def test_bad_tls_files_are_a_one_line_error(certs, tmp_path, case):
    cert, said = ((tmp_path / "missing.pem", "No such file") if case == "missing"
                  else (certs.client_cert, "KEY_VALUES_MISMATCH"))  # not the key's certificate
    proc = ServerProcess(TEST_FLEET, "--ssl-keyfile", str(certs.server_key),
                         "--ssl-certfile", str(cert))
    with pytest.raises(AssertionError, match="server exited"):
        proc.start(timeout=30)
    code = proc.stop()
    assert code != 0 and "Traceback" not in proc.log
    assert any(line.startswith("error: ") and str(cert) in line and said in line
               for line in proc.lines), proc.log


def test_the_cli_clients_speak_mutual_tls(mtls_server, certs, capsys):
    """`doppelchip generate` and `doppelchip load` take the CA and a client certificate."""
    from doppelchip.cli import main

    trust = ["--target", mtls_server.target, "--ssl-ca-certs", str(certs.ca)]
    mine = [*trust, "--ssl-certfile", str(certs.client_cert),
            "--ssl-keyfile", str(certs.client_key)]
    assert main(["generate", "hi", "--max-tokens", "3", "--ignore-eos", *mine]) == 0
    assert "3 tokens" in capsys.readouterr().err
    assert main(["generate", "hi", "--max-tokens", "3", *trust]) == 1  # no client certificate
    assert "UNAVAILABLE" in capsys.readouterr().err
    assert main(["load", *mine, "--num-requests", "3", "--isl", "8", "--osl", "4",
                 "--ignore-eos", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["requests"] == 3 and not summary["errors"]
    assert main(["load", *trust, "--num-requests", "1", "--json"]) == 1  # as generate: UNAVAILABLE
    assert "cannot reach" in capsys.readouterr().err
    assert main(["generate", "hi", "--ssl-certfile", str(certs.client_cert), *trust]) == 2
    assert "go together" in capsys.readouterr().err
