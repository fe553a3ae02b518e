"""Every public name of mpi4py 4.1's ``MPI.Intracomm`` (the class of ``MPI.COMM_WORLD``).

course_lib's communicators answer the names they implement; any other name on this list
raises NotImplementedError ("part of mpi4py but not of course_lib") instead of a bare
AttributeError. Generated from the installed mpi4py (``tests/test_p2p_mpi4py.py``
checks it against the live class when mpi4py is installed)::

    from mpi4py import MPI
    sorted(n for n in dir(MPI.Intracomm) if not n.startswith("_"))
"""
from __future__ import annotations

MPI4PY_VERSION = "4.1.2"

MPI4PY_COMM_METHODS = (
    "Abort", "Accept", "Ack_failed", "Agree", "Allgather", "Allgather_init", "Allgatherv",
    "Allgatherv_init", "Allreduce", "Allreduce_init", "Alltoall", "Alltoall_init", "Alltoallv",
    "Alltoallv_init", "Alltoallw", "Alltoallw_init", "Attach_buffer", "Barrier", "Barrier_init",
    "Bcast", "Bcast_init", "Bsend", "Bsend_init", "Call_errhandler", "Cart_map", "Clone", "Compare",
    "Connect", "Create", "Create_cart", "Create_dist_graph", "Create_dist_graph_adjacent",
    "Create_errhandler", "Create_from_group", "Create_graph", "Create_group", "Create_intercomm",
    "Create_keyval", "Delete_attr", "Detach_buffer", "Disconnect", "Dup", "Dup_with_info", "Exscan",
    "Exscan_init", "Flush_buffer", "Free", "Free_keyval", "Gather", "Gather_init", "Gatherv",
    "Gatherv_init", "Get_attr", "Get_errhandler", "Get_failed", "Get_group", "Get_info", "Get_name",
    "Get_parent", "Get_rank", "Get_size", "Get_topology", "Graph_map", "Iagree", "Iallgather",
    "Iallgatherv", "Iallreduce", "Ialltoall", "Ialltoallv", "Ialltoallw", "Ibarrier", "Ibcast",
    "Ibsend", "Idup", "Idup_with_info", "Iexscan", "Iflush_buffer", "Igather", "Igatherv",
    "Improbe", "Iprobe", "Irecv", "Ireduce", "Ireduce_scatter", "Ireduce_scatter_block", "Irsend",
    "Is_inter", "Is_intra", "Is_revoked", "Iscan", "Iscatter", "Iscatterv", "Isend", "Isendrecv",
    "Isendrecv_replace", "Ishrink", "Issend", "Join", "Mprobe", "Precv_init", "Probe", "Psend_init",
    "Recv", "Recv_init", "Reduce", "Reduce_init", "Reduce_scatter", "Reduce_scatter_block",
    "Reduce_scatter_block_init", "Reduce_scatter_init", "Revoke", "Rsend", "Rsend_init", "Scan",
    "Scan_init", "Scatter", "Scatter_init", "Scatterv", "Scatterv_init", "Send", "Send_init",
    "Sendrecv", "Sendrecv_replace", "Set_attr", "Set_errhandler", "Set_info", "Set_name", "Shrink",
    "Spawn", "Spawn_multiple", "Split", "Split_type", "Ssend", "Ssend_init", "allgather",
    "allreduce", "alltoall", "barrier", "bcast", "bsend", "exscan", "f2py", "free", "fromhandle",
    "fromint", "gather", "group", "handle", "ibsend", "improbe", "info", "iprobe", "irecv",
    "is_inter", "is_intra", "is_topo", "isend", "issend", "mprobe", "name", "probe", "py2f", "rank",
    "recv", "reduce", "scan", "scatter", "send", "sendrecv", "size", "ssend", "toint", "topology",
)
