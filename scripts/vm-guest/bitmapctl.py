#!/usr/bin/python3
"""One request to a pmemblk server's bitmap control socket (docs/bitmaps.md, "Control socket"), without the JVM
start of `pmemblk bitmap`: what the guest scenarios and the host's steps use.

  bitmapctl.py SOCKET REQUEST...     e.g. bitmapctl.py /tmp/pool.bitmaps/control.sock checkpoint b

Prints the answer's lines after "ok"; exits 1 with the server's "error: ..." line otherwise.
"""
import socket
import sys


def request(path, line):
    """The answer's lines after "ok" (a string); raises RuntimeError with the server's error otherwise."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(120)
    try:
        s.connect(path)
        s.sendall((line + "\n").encode())
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    text = data.decode(errors="replace")
    if not text.startswith("ok\n"):
        raise RuntimeError(f"bitmap control '{line}' on {path}: {text.strip() or 'no answer'}")
    return text[3:]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    try:
        sys.stdout.write(request(sys.argv[1], " ".join(sys.argv[2:])))
    except (OSError, RuntimeError) as e:
        print(f"bitmapctl: {e}", file=sys.stderr)
        sys.exit(1)
