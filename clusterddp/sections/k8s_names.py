"""Kubernetes' own naming rules (apimachinery ``pkg/util/validation``), as checks.

Every name the Kubernetes renderer writes is checked with these at load time, so a bad
namespace or label is ``jobs/x.yaml:12: kubernetes.namespace: ...`` on the laptop instead of
a 422 from the API server, or a manifest that silently means something else. Each function
is a ``specload.check``: value -> problem or None.
"""

from __future__ import annotations

import re

from clusterddp.validate import shown

#: RFC 1123 label: namespaces, Secret keys' owners, most object names (IsDNS1123Label).
DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
#: RFC 1035 label: TrainJob names (its CEL rule), Services (PyTorchJob makes one per pod).
DNS1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
#: RFC 1123 subdomain: ServiceAccounts, Secrets, PriorityClasses, runtimes (IsDNS1123Subdomain).
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
#: The name part of a qualified name (label and annotation keys, resource names) and a label value.
QUALIFIED_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
#: A resource.Quantity without a sign (the CRDs' own pattern for int-or-string quantities).
QUANTITY = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))?")
#: Container env names (IsEnvVarName): what a pod accepts; the job file's own rule is stricter.
ENV_VAR_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
LABEL_MAX = 63
SUBDOMAIN_MAX = 253


def _pattern_problem(value: str, pattern: re.Pattern[str], limit: int, what: str) -> str | None:
    if not value:
        return f"must be {what}, got an empty string"
    if len(value) > limit:
        return f"must be {what} of at most {limit} characters, got {len(value)}"
    if pattern.fullmatch(value) is None:
        return f"must be {what}, got {shown(value)}"
    return None


def dns1123_label_problem(value: str) -> str | None:
    return _pattern_problem(value, DNS1123_LABEL, LABEL_MAX,
                            "a DNS-1123 label (lower-case letters, digits, '-', starting and ending alphanumeric)")


def dns1035_label_problem(value: str) -> str | None:
    return _pattern_problem(value, DNS1035_LABEL, LABEL_MAX,
                            "a DNS-1035 label (lower-case letters, digits, '-', starting with a letter)")


def subdomain_problem(value: str) -> str | None:
    return _pattern_problem(value, DNS1123_SUBDOMAIN, SUBDOMAIN_MAX,
                            "a DNS-1123 subdomain (lower-case letters, digits, '-', '.')")


def qualified_name_problem(value: str) -> str | None:
    """A label or annotation key, or a resource name: ``[prefix/]name``, the prefix a DNS
    subdomain, the name at most 63 of letters, digits, '-', '_', '.' (IsQualifiedName)."""
    prefix, slash, name = value.rpartition("/")
    if slash and subdomain_problem(prefix):
        return f"the prefix of {shown(value)} {subdomain_problem(prefix)}"
    if slash and not name:
        return f"{shown(value)} has an empty name after '/'"
    problem = _pattern_problem(name, QUALIFIED_NAME, LABEL_MAX,
                               "a name of letters, digits, '-', '_', '.' (starting and ending alphanumeric)")
    return f"key {shown(value)}: {problem}" if problem else None


def label_value_problem(value: str) -> str | None:
    """A label value: empty, or at most 63 of letters, digits, '-', '_', '.' (IsValidLabelValue)."""
    if value == "":
        return None
    problem = _pattern_problem(value, QUALIFIED_NAME, LABEL_MAX,
                               "a label value (letters, digits, '-', '_', '.', starting and ending alphanumeric)")
    return problem


def quantity_problem(value: str) -> str | None:
    """A positive resource quantity such as ``4``, ``500m``, ``64Gi`` or ``1e3``."""
    if len(value) > 64 or QUANTITY.fullmatch(value) is None:
        return f"must be a Kubernetes quantity such as '4', '500m' or '64Gi', got {shown(value)}"
    digits = re.match(r"[0-9.]*", value)
    if digits is not None and not digits.group(0).strip("0."):
        return f"must be more than zero, got {shown(value)}"
    return None


def env_var_name_problem(value: str) -> str | None:
    return _pattern_problem(value, ENV_VAR_NAME, 256, "a container environment variable name")


#: A Secret's data key (IsConfigMapKey): letters, digits, '-', '_', '.'.
CONFIG_MAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def secret_key_problem(value: str) -> str | None:
    if value in (".", "..") or value.startswith(".."):
        return f"is not a Secret key: {shown(value)}"
    return _pattern_problem(value, CONFIG_MAP_KEY, SUBDOMAIN_MAX, "a Secret key (letters, digits, '-', '_', '.')")
