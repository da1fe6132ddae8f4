"""canopy's cluster control plane: cluster metadata and controller election kept in etcd.

controller/ talks to etcd only (etcd.py is the client); it imports nothing from broker/,
replication/ or storage/.
"""
