"""A stand-in for a browser and its push service on 127.0.0.1, over HTTPS, for the Web Push tests.

A :class:`Browser` is made as a browser makes its PushSubscription: a P-256 key pair and a 16-byte
authentication secret (``cryptography``), with an endpoint of its own on :class:`PushService`. For
each message the server POSTs there, the service checks what a push service checks: the VAPID
``Authorization: vapid t=JWT, k=KEY`` header (an ES256 JWT signed by the key in ``k``, which must
be the server's public key, whose ``aud`` is the endpoint's origin, with an ``exp`` in the next 24
hours and a ``sub``), a ``TTL`` and ``Content-Encoding: aes128gcm``; then it decrypts the body with
``http_ece`` and the browser's private key and secret, as the browser would, and keeps the JSON.
It answers what the browser's ``status`` says (201; 410 once it unsubscribed; 500 for an outage).
The service speaks TLS with a certificate it makes for 127.0.0.1: give the server ``cert_path`` as
REQUESTS_CA_BUNDLE so it trusts it.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import queue
import secrets
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Address

import http_ece
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import NameOID


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Browser:
    """One browser's subscription: its keys, its endpoint and what it was sent."""

    def __init__(self, service: "PushService", name: str):
        self.service, self.name = service, name
        self.private_key = ec.generate_private_key(ec.SECP256R1())
        self.auth = secrets.token_bytes(16)
        self.token = secrets.token_urlsafe(24)
        self.status = 201
        self.received: queue.Queue = queue.Queue()  # {"message", "claims", "ttl", "urgency", "status"}

    @property
    def endpoint(self) -> str:
        return f"{self.service.origin}/push/{self.token}"

    def subscription(self) -> dict:
        """What PushSubscription.toJSON() gives the page."""
        point = self.private_key.public_key().public_bytes(serialization.Encoding.X962,
                                                           serialization.PublicFormat.UncompressedPoint)
        return {"endpoint": self.endpoint, "expirationTime": None, "keys": {"p256dh": b64url(point),
                                                                          "auth": b64url(self.auth)}}

    def next(self, timeout: float = 20) -> dict:
        """The next message the server sent this browser (waits for it)."""
        return self.received.get(timeout=timeout)

    def nothing_more(self) -> bool:
        return self.received.empty()


class PushService:
    """The HTTPS server that takes the server's messages for every :class:`Browser` made on it."""

    def __init__(self, directory: str, server_key: str | None = None):
        self.server_key = server_key  # the VAPID public key messages must be signed with (set once known)
        self.browsers: dict[str, Browser] = {}
        self.refused: list[str] = []  # why a request was refused, for the test to see
        self.cert_path = os.path.join(directory, "push-service.pem")
        key = ec.generate_private_key(ec.SECP256R1())
        self._write_certificate(key, os.path.join(directory, "push-service.key"))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_path, os.path.join(directory, "push-service.key"))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.origin = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def browser(self, name: str) -> Browser:
        b = Browser(self, name)
        self.browsers[b.token] = b
        return b

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _write_certificate(self, key: ec.EllipticCurvePrivateKey, key_path: str) -> None:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(IPv4Address("127.0.0.1"))]), critical=False)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        with open(self.cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(key_path, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))

    def check_vapid(self, header: str) -> dict:
        """The JWT's claims if ``header`` is a valid VAPID Authorization for this service; else ValueError."""
        scheme, _, params = header.partition(" ")
        if scheme.lower() != "vapid":
            raise ValueError(f"Authorization scheme {scheme!r}, not vapid")
        parts = dict(p.strip().split("=", 1) for p in params.split(","))
        if self.server_key is not None and parts["k"] != self.server_key:
            raise ValueError("k= is not the server's VAPID public key")
        head, body, signature = parts["t"].split(".")
        if json.loads(unb64url(head)) != {"typ": "JWT", "alg": "ES256"}:
            raise ValueError(f"JWT header {unb64url(head)!r}")
        raw = unb64url(signature)
        public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(parts["k"]))
        try:
            public.verify(encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")),
                          f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise ValueError("the JWT's signature does not verify with k=") from None
        claims = json.loads(unb64url(body))
        if claims["aud"] != self.origin:
            raise ValueError(f"aud {claims['aud']!r} is not {self.origin!r}")
        if not time.time() < claims["exp"] <= time.time() + 24 * 3600:
            raise ValueError(f"exp {claims['exp']} is not within the next 24 hours")
        if not claims.get("sub", "").startswith(("mailto:", "https://")):
            raise ValueError(f"sub {claims.get('sub')!r}")
        return claims

    def _handler(self):
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                browser = service.browsers.get(self.path.removeprefix("/push/"))
                if browser is None:
                    return self._answer(404)
                try:
                    claims = service.check_vapid(self.headers.get("Authorization", ""))
                    if self.headers.get("Content-Encoding") != "aes128gcm" or "TTL" not in self.headers:
                        raise ValueError(f"Content-Encoding {self.headers.get('Content-Encoding')!r}, TTL "
                                         f"{self.headers.get('TTL')!r}")
                    message = json.loads(http_ece.decrypt(body, private_key=browser.private_key,
                                                          auth_secret=browser.auth, version="aes128gcm"))
                except Exception as e:  # a push service refuses what it cannot check or read
                    service.refused.append(f"{type(e).__name__}: {e}")
                    return self._answer(400)
                browser.received.put({"message": message, "claims": claims, "ttl": int(self.headers["TTL"]),
                                      "urgency": self.headers.get("Urgency"), "status": browser.status})
                self._answer(browser.status)

            def _answer(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler
