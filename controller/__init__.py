"""canopy's cluster control plane: cluster metadata and controller election kept in etcd.

controller/ talks to etcd only (etcd.py is the client). It uses replication/'s tree and
election rules and protocol/'s error codes, and nothing from broker/ or storage/: what it
needs of the broker (config validation, the offsets topic's shape) comes through the
``cluster`` object broker/cluster.py hands it.
"""
