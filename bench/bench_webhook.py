"""The admission webhook's cost per pod creation: the decision alone (the baseline), then one
AdmissionReview over HTTPS on a kept-alive connection (how the API server's client calls it) and
on a new TLS connection per review (the worst case), and making a CA + serving pair.

    PYTHONPATH=. .venv/bin/python bench/bench_webhook.py [--repeat 300]

The API server waits at most the webhook's timeoutSeconds (5 s in the chart) per pod create; the
figures below are what each review adds to a create on this machine (medians).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_webhook import pod, review  # noqa: E402  (the tests' AdmissionReview shape)

from gpuwarden.kube.certs import CertPolicy, plan_rotation, write_cert_files  # noqa: E402
from gpuwarden.kube.webhook import admission_response, serve_webhook  # noqa: E402


def median_seconds(step: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()

    policy = CertPolicy("gw-scheduler", "gpuwarden", extra_dns_names=("localhost",))
    pair = median_seconds(lambda: plan_rotation(None, policy, datetime.now(UTC)), 20)
    rotation = plan_rotation(None, policy, datetime.now(UTC))
    assert rotation is not None
    body = json.dumps(review(pod())).encode()
    parsed = json.loads(body)
    decision = median_seconds(lambda: admission_response(parsed), args.repeat * 10)

    cert_dir = tempfile.mkdtemp(prefix="gpuwarden-webhook-bench-")
    write_cert_files(rotation.data, cert_dir)
    server = serve_webhook(cert_dir, port=0, host="127.0.0.1")
    context = ssl.create_default_context(cadata=base64.b64decode(rotation.data["ca.crt"]).decode())

    def post(connection: http.client.HTTPSConnection) -> None:
        connection.request("POST", "/mutate-pods", body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 200 and "patch" in json.loads(answer.read())["response"]

    kept = http.client.HTTPSConnection("localhost", server.port, context=context)

    def fresh() -> None:
        connection = http.client.HTTPSConnection("localhost", server.port, context=context)
        post(connection)
        connection.close()

    try:
        kept_alive = median_seconds(lambda: post(kept), args.repeat)
        new_connection = median_seconds(fresh, args.repeat)
    finally:
        kept.close()
        server.stop()
    print(f"decision alone (baseline): {decision * 1e6:8.1f} us")
    print(f"HTTPS, kept-alive:         {kept_alive * 1e3:8.2f} ms  ({kept_alive / decision:.0f}x baseline)")
    print(f"HTTPS, new TLS connection: {new_connection * 1e3:8.2f} ms  ({new_connection / decision:.0f}x baseline)")
    print(f"CA + serving pair:         {pair * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
