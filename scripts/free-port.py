"""Prints a free loopback port below the kernel's ephemeral range: a port that a process binding port 0 (every
test server) is never given, so none takes it between this pick and the bind of the server it is for."""

import random
import socket

with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    low = int(f.read().split()[0])
while True:
    port = random.randrange(10_000, low)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
