"""A small PKI for trying svcproxy out and for tests: a CA, the frontend's serving
certificate, node certificates named as kubelet's are, and named identities.

``svcproxy certs DIR --node NAME ...`` writes them (PEM, EC P-256, valid one day by
default); a real cluster uses its own CA (cert-manager, the cluster's signer).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as PEM files."""

    cert: Path
    key: Path

    def pem(self) -> tuple[bytes, bytes]:
        return self.key.read_bytes(), self.cert.read_bytes()


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(directory: Path, stem: str, cert: x509.Certificate,
           key: ec.EllipticCurvePrivateKey) -> Issued:
    out = Issued(directory / f"{stem}.crt", directory / f"{stem}.key")
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    out.key.chmod(0o600)
    return out


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


class CA:
    """A certificate authority writing what it issues into ``directory``."""

    def __init__(self, directory: Path, name: str = "test-ca") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(name)
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.file = _write(directory, name, self.cert, self.key).cert

    def issue(self, stem: str, cn: str, orgs: tuple[str, ...] = (), server: bool = False,
              names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Issued:
        """A leaf certificate: a server's (for ``names``: DNS names or IPs) or a client's."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs))
                   .issuer_name(self.name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), False))
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(n) for n in names]), False)
        return _write(self.directory, stem, builder.sign(self.key, hashes.SHA256()), key)


def write_dev_pki(directory: Path, server_names: tuple[str, ...], nodes: tuple[str, ...],
                  identities: tuple[str, ...]) -> list[Path]:
    """ca.crt, frontend.crt/key for ``server_names``, NODE.crt/key per node (CN
    system:node:NODE, O system:nodes) and NAME.crt/key per identity; returns the files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CA(directory, "ca")
    out = [ca.file]
    issued = [ca.issue("frontend", "svcproxy-frontend", server=True, names=server_names)]
    issued += [ca.issue(n, f"system:node:{n}", ("system:nodes",)) for n in nodes]
    issued += [ca.issue(n, n) for n in identities]
    (directory / "ca.key").unlink()
    for item in issued:
        out += [item.cert, item.key]
    return out
