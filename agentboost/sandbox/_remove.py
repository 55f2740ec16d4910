"""Remove a directory tree whatever a program did to it: iteratively, a bounded number of descriptors.

Stdlib only (the host's clean-up and the batch harness use it). A program may leave a chain of thousands
of directories (deeper than ``PATH_MAX`` and than any recursion limit), directories with mode 0 (unreadable
even to their owner until their mode is put back) and names of any bytes. :func:`remove_tree` walks the
tree depth-first with directory descriptors, every name relative to its directory (``*at`` calls), so no
path ever gets long; it holds at most three descriptors at a time, going back up through ``..`` and
checking that ``..`` is the directory it came from (device and inode). Each directory is made ``0700``
before it is opened (its owner, or root, may always do that). It never raises: it returns whether the
tree is gone.

Only for trees nothing else is changing any more (every process that could write there is dead).
"""

# ruff: noqa: SIM105 - no contextlib here: the harness imports as little as it can

import os
import stat

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path, keep_top=False):
    """Remove ``path`` and everything below it (``keep_top``: empty it, keep it). True if done; a path
    that does not exist is done. Symbolic links are removed, never followed."""
    path = os.fsencode(path)
    parent, name = os.path.split(path.rstrip(b"/") or b"/")
    try:
        parent_fd = os.open(parent or b".", _OPEN_DIR)
    except OSError:
        return not os.path.lexists(path)
    try:
        try:
            info = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(info.st_mode):
            if keep_top:
                return False
            os.unlink(name, dir_fd=parent_fd)
            return True
        if not _empty(parent_fd, name):
            return False
        if not keep_top:
            os.rmdir(name, dir_fd=parent_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(parent_fd)


def _open_child(parent_fd, name):
    """Open directory ``name`` of ``parent_fd`` for listing, after giving it back its owner's rights."""
    try:
        return os.open(name, _OPEN_DIR, dir_fd=parent_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent_fd)  # a directory (checked by the caller), nothing can swap it
        return os.open(name, _OPEN_DIR, dir_fd=parent_fd)


def _empty(top_parent_fd, top_name):
    """Empty directory ``top_name`` of ``top_parent_fd``, depth-first, without recursion."""
    os.chmod(top_name, 0o700, dir_fd=top_parent_fd)
    fd = _open_child(top_parent_fd, top_name)
    way = []  # (name, device, inode) of each directory from the top one down to the current one's parent
    top = os.fstat(fd)
    current = (top.st_dev, top.st_ino)
    try:
        while True:
            child = _clear_files(fd)  # every non-directory gone; the name of a subdirectory, or None
            if child is not None:
                os.chmod(child, 0o700, dir_fd=fd)
                sub = _open_child(fd, child)
                info = os.fstat(sub)
                way.append((child, current))
                current = (info.st_dev, info.st_ino)
                os.close(fd)
                fd = sub
                continue
            if not way:
                return True
            name, up_id = way.pop()
            up = os.open(b"..", _OPEN_DIR, dir_fd=fd)
            info = os.fstat(up)
            os.close(fd)
            fd = up
            if (info.st_dev, info.st_ino) != up_id:  # the tree moved under us: stop rather than wander
                return False
            current = up_id
            os.rmdir(name, dir_fd=fd)
    except OSError:
        return False
    finally:
        os.close(fd)


def _clear_files(fd):
    """Unlink every entry of directory ``fd`` that is not a directory; return one subdirectory's name."""
    subdir = None
    for entry in os.scandir(fd):
        name = os.fsencode(entry.name)
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            if subdir is None:
                subdir = name
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
    return subdir
