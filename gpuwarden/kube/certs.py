"""The admission webhook's own CA and serving certificate, when cert-manager is not installed.

As Kueue's cert-controller does: a CA and a serving certificate for ``<service>.<namespace>.svc``
live in one Secret (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``); the webhook configuration's
``caBundle`` is the Secret's ``ca.crt``. :func:`plan_rotation` is the pure decision on what the
Secret holds; :class:`WebhookCertificates` carries it out through :meth:`KubeApi.call`:
- nothing usable in the Secret (absent, unreadable, a key missing, the pair not matching): a new
  CA and serving certificate;
- the serving certificate within ``cert_rotate_before_days`` of expiry, or not for the service's
  name, or not signed by the current CA: a new one from the current CA;
- the CA within ``ca_rotate_before_days`` of expiry: a new CA signs a new serving certificate, and
  the old CA stays in ``ca.crt`` (so in the caBundle) until it expires, so a replica still serving
  the old certificate stays trusted while the new one propagates (the overlap).
Every replica runs it (each needs the files); it is idempotent across them: the Secret is read
first and written with the read ``resourceVersion``, and a 409 means another replica won, so it
re-reads and finds nothing left to do. Keys are ECDSA P-256 (fast to make, accepted by the API server).
"""

from __future__ import annotations

import base64
import logging
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .api import MERGE_PATCH, Json, KubeApi
from .failure import Conflict, NotFound
from .webhook import CERT_FILE, KEY_FILE

log = logging.getLogger("gpuwarden.kube.certs")

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SECRET_KEYS = (CA_CERT, CA_KEY, CERT_FILE, KEY_FILE)
BACKDATE = timedelta(hours=1)  # clock skew between this replica and the API server


@dataclass(frozen=True)
class CertPolicy:
    service: str
    namespace: str
    extra_dns_names: tuple[str, ...] = ()  # e.g. "localhost" for a test
    ca_validity_days: int = 3650
    cert_validity_days: int = 365
    cert_rotate_before_days: int = 30
    ca_rotate_before_days: int = 90

    def __post_init__(self) -> None:
        if not self.service or not self.namespace:
            raise ValueError(f"the webhook's service and namespace are required (got {self.service!r}, {self.namespace!r})")
        for longer, shorter in (("ca_validity_days", "ca_rotate_before_days"),
                                ("cert_validity_days", "cert_rotate_before_days")):
            if not 0 < getattr(self, shorter) < getattr(self, longer):
                raise ValueError(f"{shorter}={getattr(self, shorter)} must be above 0 and below "
                                 f"{longer}={getattr(self, longer)}")

    @property
    def dns_names(self) -> tuple[str, ...]:
        return (f"{self.service}.{self.namespace}.svc", *self.extra_dns_names)


@dataclass(frozen=True)
class Rotation:
    data: dict[str, str]  # the Secret's new data (base64 values)
    reason: str


# -- making certificates ----------------------------------------------------------------------------

def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(policy: CertPolicy, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuwarden-webhook-ca@{int(now.timestamp())}")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + timedelta(days=policy.ca_validity_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def make_serving_cert(policy: CertPolicy, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                      now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A serving certificate for the policy's DNS names, never outliving its CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    expires = min(now + timedelta(days=policy.cert_validity_days), ca.not_valid_after_utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, policy.dns_names[0])]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(expires)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in policy.dns_names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


# -- deciding ------------------------------------------------------------------------------------------

def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret_data(cas: list[x509.Certificate], ca_key: ec.EllipticCurvePrivateKey, cert: x509.Certificate,
                 key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    return {CA_CERT: _b64(b"".join(_pem(c) for c in cas)), CA_KEY: _b64(_pem_key(ca_key)),
            CERT_FILE: _b64(_pem(cert)), KEY_FILE: _b64(_pem_key(key))}


def _fresh(policy: CertPolicy, now: datetime, older_cas: list[x509.Certificate], reason: str) -> Rotation:
    ca, ca_key = make_ca(policy, now)
    cert, key = make_serving_cert(policy, ca, ca_key, now)
    return Rotation(_secret_data([ca, *older_cas], ca_key, cert, key), reason)


def _load(data: Mapping[str, str]) -> tuple[list[x509.Certificate], ec.EllipticCurvePrivateKey, x509.Certificate,
                                            ec.EllipticCurvePrivateKey]:
    missing = [k for k in SECRET_KEYS if not data.get(k)]
    if missing:
        raise ValueError(f"keys {missing} missing")
    cas = x509.load_pem_x509_certificates(base64.b64decode(data[CA_CERT]))
    ca_key = serialization.load_pem_private_key(base64.b64decode(data[CA_KEY]), None)
    cert = x509.load_pem_x509_certificate(base64.b64decode(data[CERT_FILE]))
    key = serialization.load_pem_private_key(base64.b64decode(data[KEY_FILE]), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("keys are not ECDSA")
    if cas[0].public_key() != ca_key.public_key():
        raise ValueError("ca.key does not match the first certificate of ca.crt")
    if cert.public_key() != key.public_key():
        raise ValueError("tls.key does not match tls.crt")
    return cas, ca_key, cert, key


def _cert_problem(policy: CertPolicy, cert: x509.Certificate, ca: x509.Certificate, now: datetime) -> str | None:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "the serving certificate is not signed by the current CA"
    try:
        names = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                    .get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = set()
    if not set(policy.dns_names) <= names:
        return f"the serving certificate names {sorted(names)}, not {list(policy.dns_names)}"
    if cert.not_valid_after_utc - now <= timedelta(days=policy.cert_rotate_before_days):
        return f"the serving certificate expires at {cert.not_valid_after_utc.isoformat()}"
    return None


def plan_rotation(data: Mapping[str, str] | None, policy: CertPolicy, now: datetime) -> Rotation | None:
    """The Secret data to write, or None when what ``data`` holds is good for now."""
    if not data:
        return _fresh(policy, now, [], "no certificate yet")
    try:
        cas, ca_key, cert, key = _load(data)
    except (ValueError, TypeError) as error:
        return _fresh(policy, now, [], f"the Secret holds no usable certificate ({error})")
    live_cas = [c for c in cas if c.not_valid_after_utc > now]
    if cas[0] not in live_cas or cas[0].not_valid_after_utc - now <= timedelta(days=policy.ca_rotate_before_days):
        return _fresh(policy, now, live_cas, f"the CA expires at {cas[0].not_valid_after_utc.isoformat()}")
    problem = _cert_problem(policy, cert, cas[0], now)
    if problem:
        cert, key = make_serving_cert(policy, cas[0], ca_key, now)
        return Rotation(_secret_data(live_cas, ca_key, cert, key), problem)
    if len(live_cas) < len(cas):
        return Rotation(_secret_data(live_cas, ca_key, cert, key), "an expired CA left the bundle")
    return None


# -- carrying it out ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnsureResult:
    data: dict[str, str]  # the Secret's data now
    rotated: str | None  # why this replica wrote the Secret, or None
    ca_bundle_patched: bool


class WebhookCertificates:
    """Keeps the Secret, the webhook configuration's caBundle and (optionally) local files current."""

    def __init__(self, api: KubeApi, policy: CertPolicy, secret_name: str, webhook_configuration: str,
                 clock: Clock = SYSTEM_CLOCK, attempts: int = 3) -> None:
        self.api, self.policy, self.clock = api, policy, clock
        self.secret_name, self.webhook_configuration = secret_name, webhook_configuration
        self.admission = client.AdmissionregistrationV1Api(api.client)
        self.attempts = attempts

    def _read_secret(self) -> Json | None:
        try:
            return self.api.call(self.api.core.read_namespaced_secret, self.secret_name, self.policy.namespace,
                                 verb="get", resource="secrets")
        except NotFound:
            return None

    def _write_secret(self, current: Json | None, data: dict[str, str]) -> None:
        if current is None:
            body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": self.secret_name, "namespace": self.policy.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "gpuwarden"}},
                    "data": data}
            self.api.call(self.api.core.create_namespaced_secret, self.policy.namespace, body, verb="create",
                          resource="secrets")
        else:
            body = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "data": data}
            self.api.call(self.api.core.patch_namespaced_secret, self.secret_name, self.policy.namespace, body,
                          verb="patch", resource="secrets", _content_type=MERGE_PATCH)

    def ensure_secret(self) -> tuple[dict[str, str], str | None]:
        """The Secret's data once it is current, and why this replica rotated it (None: it did not)."""
        for _ in range(self.attempts):
            current = self._read_secret()
            data = dict((current or {}).get("data") or {})
            rotation = plan_rotation(data, self.policy, self.clock.now())
            if rotation is None:
                return data, None
            try:
                self._write_secret(current, rotation.data)
            except Conflict:  # another replica wrote first: use theirs
                log.info("secret %s/%s: another replica wrote it first; re-reading", self.policy.namespace,
                         self.secret_name)
                continue
            log.info("secret %s/%s: new webhook certificate (%s)", self.policy.namespace, self.secret_name,
                     rotation.reason)
            return rotation.data, rotation.reason
        raise Conflict(f"secret {self.policy.namespace}/{self.secret_name}: still conflicting after "
                       f"{self.attempts} tries; retry later")

    def inject_ca_bundle(self, ca_bundle: str) -> bool:
        """Set every webhook's caBundle in the configuration; True when it had to be patched."""
        for _ in range(self.attempts):
            try:
                config = self.api.call(self.admission.read_mutating_webhook_configuration, self.webhook_configuration,
                                       verb="get", resource="mutatingwebhookconfigurations")
            except NotFound:
                log.warning("mutatingwebhookconfiguration %s not found: no caBundle to set (is the chart's "
                            "scheduling.enabled on?)", self.webhook_configuration)
                return False
            webhooks: list[dict[str, Any]] = config.get("webhooks") or []
            if all((w.get("clientConfig") or {}).get("caBundle") == ca_bundle for w in webhooks):
                return False
            for webhook in webhooks:
                webhook.setdefault("clientConfig", {})["caBundle"] = ca_bundle
            # The whole list with the read resourceVersion: a merge patch replaces lists, and a stale
            # version (a helm upgrade meanwhile) is a 409, so nothing else in the list is overwritten.
            body = {"metadata": {"resourceVersion": config["metadata"]["resourceVersion"]}, "webhooks": webhooks}
            try:
                self.api.call(self.admission.patch_mutating_webhook_configuration, self.webhook_configuration, body,
                              verb="patch", resource="mutatingwebhookconfigurations", _content_type=MERGE_PATCH)
            except Conflict:
                continue
            log.info("mutatingwebhookconfiguration %s: caBundle set", self.webhook_configuration)
            return True
        raise Conflict(f"mutatingwebhookconfiguration {self.webhook_configuration}: still conflicting "
                       f"after {self.attempts} tries; retry later")

    def ensure(self, cert_dir: str | Path | None = None) -> EnsureResult:
        """One pass: the Secret current, the caBundle its ``ca.crt``, and ``cert_dir``'s files its pair.

        The scheduler calls it at start and then periodically on every replica; ``cert_dir`` is the
        folder ``webhook.serve_webhook`` reads (an emptyDir), written without waiting for the kubelet
        to refresh a mounted Secret.
        """
        data, rotated = self.ensure_secret()
        patched = self.inject_ca_bundle(data[CA_CERT])
        if cert_dir is not None:
            write_cert_files(data, cert_dir)
        return EnsureResult(data, rotated, patched)


def write_cert_files(data: Mapping[str, str], cert_dir: str | Path) -> bool:
    """Write ``tls.crt`` / ``tls.key`` from Secret data when they differ; True when written.

    Each file is replaced atomically (the key first, so a reader never pairs a new certificate with
    an old key for long: the server reloads on the next change it sees and keeps the old context if
    a pair does not load).
    """
    folder = Path(cert_dir)
    folder.mkdir(parents=True, exist_ok=True)
    wrote = False
    for name in (KEY_FILE, CERT_FILE):
        content = base64.b64decode(data[name])
        path = folder / name
        if path.is_file() and path.read_bytes() == content:
            continue
        fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(temp, 0o600)
        os.replace(temp, path)
        wrote = True
    return wrote
