"""The buffering proxy in front of gunicorn (issue 33, fault 3, hostile review): compose's only
published port is nginx's, with the slow-client timeouts in deploy/nginx.conf. nginx is not
installed on the test machines, so the file is parsed with crossplane (nginx's own parser,
ported); where an nginx binary exists, `nginx -t` checks it too."""

import shutil
import subprocess
from pathlib import Path

import crossplane
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "deploy" / "nginx.conf"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def _directives(block: list[dict], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[list[str]]]:
    """{(enclosing blocks..., name): [args of each occurrence]} of a parsed config."""
    found: dict[tuple[str, ...], list[list[str]]] = {}
    for d in block:
        found.setdefault((*path, d["directive"]), []).append(d["args"])
        if "block" in d:
            for key, value in _directives(d["block"], (*path, d["directive"])).items():
                found.setdefault(key, []).extend(value)
    return found


def test_the_proxy_config_parses_and_bounds_slow_clients():
    parsed = crossplane.parse(str(CONF), check_ctx=True, check_args=True)
    assert parsed["status"] == "ok", parsed["errors"]
    d = _directives(parsed["config"][0]["parsed"])
    http = lambda name: d[("http", name)][0]  # noqa: E731
    assert http("client_header_timeout") == ["10s"]  # a head byte by byte gets a 408 after 10 s
    assert http("client_body_timeout") == ["30s"] and http("send_timeout") == ["30s"]
    assert http("proxy_request_buffering") == ["on"] and http("proxy_buffering") == ["on"]
    assert http("client_max_body_size") == ["60m"]  # above MAX_UPLOAD_MB's default of 50
    assert d[("http", "upstream", "server")] == [["web:8000"]]
    location = ("http", "server", "location")
    assert d[(*location, "proxy_pass")] == [["http://prbench_web"]]
    # The client's own X-Forwarded-For is replaced, never appended to.
    assert ["X-Forwarded-For", "$remote_addr"] in d[(*location, "proxy_set_header")]
    # Host keeps its port (a form POST to http://localhost:8000 passes Django's Origin check), and a
    # TLS terminator's X-Forwarded-Proto survives this hop (BEHIND_TLS_PROXY then sees https).
    assert ["Host", "$http_host"] in d[(*location, "proxy_set_header")]
    assert ["X-Forwarded-Proto", "$forwarded_proto"] in d[(*location, "proxy_set_header")]
    assert d[("http", "map")] == [["$http_x_forwarded_proto", "$forwarded_proto"]]


def test_a_post_with_the_hosts_port_passes_the_csrf_origin_check(client, researcher, settings):
    """What the browser sends through the proxy at http://localhost:8000: Host with the port (as
    $http_host passes it) matches the Origin; the port-less Host $host gave was refused (403)."""
    from django.test import Client

    settings.ALLOWED_HOSTS = ["localhost"]
    browser = Client(enforce_csrf_checks=True)
    page = browser.get("/accounts/login/", HTTP_HOST="localhost:8000")
    token = page.cookies["csrftoken"].value
    form = {"username": researcher.username, "password": "wrong", "csrfmiddlewaretoken": token}
    kept = browser.post("/accounts/login/", form, HTTP_HOST="localhost:8000", HTTP_ORIGIN="http://localhost:8000")
    dropped = browser.post("/accounts/login/", form, HTTP_HOST="localhost", HTTP_ORIGIN="http://localhost:8000")
    assert kept.status_code == 200 and dropped.status_code == 403


def test_compose_publishes_only_the_proxy_and_web_trusts_one_proxy():
    services = COMPOSE["services"]
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    assert published == {"proxy": ["8000:8080"]}
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in services["proxy"]["volumes"]
    assert services["web"]["expose"] == ["8000"] and services["web"]["environment"]["NUM_PROXIES"] == "1"
    assert services["proxy"]["depends_on"] == {"web": {"condition": "service_healthy"}}


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed here")
def test_nginx_itself_accepts_the_config(tmp_path):
    # web:8000 does not resolve outside compose: test a copy pointing at the loopback.
    conf = tmp_path / "nginx.conf"
    conf.write_text(CONF.read_text().replace("server web:8000;", "server 127.0.0.1:8000;"))
    result = subprocess.run(["nginx", "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
