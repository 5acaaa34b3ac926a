"""Execute the chapters over an encrypted kernel connection.

ipykernel 7.4 logs "Kernel is running over TCP without encryption ..." once per executed
chapter when its kernel manager gives it no CurveZMQ keys. jupyter_client 8.10 can provision
them (``KernelManager.transport_encryption``: ``disabled`` by default, ``auto`` when the
kernelspec declares ``supported_encryption: curve``, as ipykernel's does), but MyST-NB creates
its kernel manager through nbclient without passing any configuration. So this extension
makes ``auto`` the default of that trait for the build's process: the kernels are launched
with Curve keys, and the notice has nothing to say. With an older jupyter_client (no such
trait) or a libzmq without Curve, nothing changes.
"""

from __future__ import annotations


def setup(app):
    try:
        import zmq
        from jupyter_client.manager import KernelManager
    except ImportError:
        return {"parallel_read_safe": True, "parallel_write_safe": True}
    trait = KernelManager.class_traits().get("transport_encryption")
    if trait is not None and zmq.has("curve"):
        trait.default_value = "auto"
    return {"parallel_read_safe": True, "parallel_write_safe": True}
