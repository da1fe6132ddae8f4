"""Fixtures shared by every test directory."""
from tests.etcd_cluster import etcd_cluster  # noqa: F401  (pytest fixture: a real 3-member etcd)
