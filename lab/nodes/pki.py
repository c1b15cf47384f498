"""Credentials of real nodes: client certificates signed by the lab's CA, and their kubeconfigs.

Each kubelet authenticates as `system:node:<name>` in `system:nodes`, so the API server's Node
authorizer limits it to its own node and pods, as in a real cluster; kube-proxy is
`system:kube-proxy`, which the default `system:node-proxier` binding covers. The CA is the one the
control plane generated (pki/ca.crt, pki/ca.key in the lab's run dir).
"""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from autoheal.errors import LabError


def _load_ca(pki: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    except OSError as exc:
        raise LabError(
            f"real nodes: the lab CA is missing ({exc.filename}); start the control plane first"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise LabError(f"real nodes: {pki / 'ca.key'} is not an EC key")
    return cert, key


def client_cert(pki: Path, common_name: str, org: str | None, out: Path) -> tuple[Path, Path]:
    """Write `<out>.crt` and `<out>.key`: a client certificate for CN/O, signed by the lab CA."""
    ca, ca_key = _load_ca(pki)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    crt, keyf = out.with_suffix(".crt"), out.with_suffix(".key")
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyf.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    keyf.chmod(0o600)
    return crt, keyf


def kubeconfig(path: Path, pki: Path, server: str, user: str, crt: Path, key: Path) -> Path:
    """A kubeconfig for `server` (the lab's API server as the nodes reach it) and a client cert."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "lab",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": b64(pki / "ca.crt"),
                    # the serving certificate names the API server, not the lab bridge's address
                    "tls-server-name": "kubernetes",
                },
            }
        ],
        "users": [{"name": user, "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
        "current-context": "lab",
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path
