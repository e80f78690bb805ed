"""A real secured KRaft broker for the security tests: SASL_SSL clients (SCRAM-SHA-512 and PLAIN users),
a certificate signed by a CA made here with openssl, and ACLs enforced by the StandardAuthorizer.

Clients (the sink) connect to ``bootstrap_servers`` (SASL_SSL). The controller and the broker's own traffic
use a PLAINTEXT listener on 127.0.0.1 (``internal_bootstrap``), whose ANONYMOUS principal is a super user: the
tests create topics and ACLs and read topics back through it, as an operator would.

    with SecuredKafka(work_dir) as broker:
        broker.allow("alice", ResourceType.TOPIC, "sec-", AclOperation.WRITE)
        options = broker.client_options("alice")  # kafka.* options for the sink
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from testing.kafka_local import KafkaCluster, free_port

# name -> (mechanism, password)
USERS = {
    "alice": ("SCRAM-SHA-512", "alice-Scram-pw-1"),
    "carol": ("SCRAM-SHA-512", "carol-Scram-pw-3"),
    "bob": ("PLAIN", "bob-Plain-pw-2"),
    "dave": ("PLAIN", "dave-Plain-pw-4"),
    "erin": ("PLAIN", "erin-Plain-pw-5"),
    "frank": ("PLAIN", "frank-Plain-pw-6"),
}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> Path:
    """A self-signed CA (key and certificate) in ``directory``; returns the certificate's path."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-days", "2", "-subj", f"/CN={name}", cwd=directory)
    return directory / f"{name}.pem"


def make_broker_keystore(directory: Path, ca: str) -> Path:
    """A broker key and certificate for 127.0.0.1/localhost signed by ``ca``, as a PEM keystore file."""
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
             "-subj", "/CN=127.0.0.1", cwd=directory)
    _openssl("x509", "-req", "-in", "broker.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", "broker.pem", "-days", "2", "-extfile", "san.ext", cwd=directory)
    keystore = directory / "broker-keystore.pem"
    keystore.write_text((directory / "broker.key").read_text() + (directory / "broker.pem").read_text()
                        + (directory / f"{ca}.pem").read_text())
    return keystore


class SecuredKafka:
    """One KRaft node: SASL_SSL for clients, PLAINTEXT inside, StandardAuthorizer, users from ``USERS``."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.certs = work / "certs"
        self.port = free_port()
        self.ca = self.certs / "test-ca.pem"
        self.other_ca = self.certs / "other-ca.pem"  # a CA that did not sign the broker's certificate
        self.cluster: KafkaCluster | None = None
        self._admin: AdminClient | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def internal_bootstrap(self) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap_servers

    def __enter__(self) -> SecuredKafka:
        make_ca(self.certs, "test-ca")
        make_ca(self.certs, "other-ca")
        keystore = make_broker_keystore(self.certs, "test-ca")
        plain_users = " ".join(f'user_{u}="{pw}"' for u, (mech, pw) in USERS.items() if mech == "PLAIN")
        internal = free_port()
        cluster = KafkaCluster(self.work / "broker", 1, port=internal, broker_props={
            "listeners": f"PLAINTEXT://127.0.0.1:{internal},SASL_SSL://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{{controller}}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{internal},SASL_SSL://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",  # the PLAINTEXT listener: the controller, the broker, the tests
            "allow.everyone.if.no.acl.found": "false",
        })
        listeners = cluster.extra["listeners"]
        cluster.extra["listeners"] = listeners.replace("{controller}", str(cluster.controller_ports[0]))
        cluster.format_args = [arg for user, (mech, pw) in USERS.items() if mech.startswith("SCRAM")
                               for arg in ("--add-scram", f"{mech}=[name={user},password={pw}]")]
        self.cluster = cluster
        try:
            cluster.start()
        except BaseException:
            cluster.stop(timeout_s=20)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.cluster is not None:
            self.cluster.stop(timeout_s=20)

    def admin(self) -> AdminClient:
        """A super user's admin client (kept: a dropped client cancels its pending futures)."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.internal_bootstrap, "log_level": 3})
        return self._admin

    def allow(self, user: str, resource: ResourceType, name: str, *operations: AclOperation,
              prefixed: bool = True) -> None:
        """Grant ``user`` the operations on the resource (a name prefix unless ``prefixed`` is false)."""
        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings = [AclBinding(resource, name, pattern, f"User:{user}", "*", op, AclPermissionType.ALLOW)
                    for op in operations]
        for future in self.admin().create_acls(bindings, request_timeout=30).values():
            future.result()

    def client_options(self, user: str, password: str | None = None, ca: Path | None = None,
                       jaas: bool = False) -> dict[str, str]:
        """The sink's kafka.* options for ``user`` (its own password unless one is given; the test CA unless
        another is given). ``jaas``: the Java client's kafka.sasl.jaas.config form, as format("kafka") takes."""
        mechanism, own = USERS[user]
        password = own if password is None else password
        options = {"kafka.bootstrap.servers": self.bootstrap_servers, "kafka.security.protocol": "SASL_SSL",
                   "kafka.sasl.mechanism": mechanism, "kafka.ssl.ca.location": str(ca or self.ca)}
        if jaas:
            module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
            options["kafka.sasl.jaas.config"] = (f'org.apache.kafka.common.security.{module} required '
                                                 f'username="{user}" password="{password}";')
        else:
            options |= {"kafka.sasl.username": user, "kafka.sasl.password": password}
        return options
