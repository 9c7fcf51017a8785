// libqccl.so is qccl_core linked whole; this file gives the shared library a translation unit of its own.
