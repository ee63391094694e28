"""A NAVI-layout folder written by the tests: the demo's writer (``probe_toolkit.demo.navi``)."""

from probe_toolkit.demo.navi import quaternion, write_navi

__all__ = ["quaternion", "write_navi"]
