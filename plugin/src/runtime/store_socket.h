// Deadlines for the store client's connection. c10d's TCPStore client
// reads replies with a plain blocking recv() and holds its mutex while it
// does: on a host cut off from the store, a reply that never comes holds
// every thread that uses the store until the kernel gives the connection
// up (tcp_retries2, about 15 minutes). The client keeps its socket to
// itself, so ronde finds it among the process's descriptors right after
// connecting and bounds it there.
#pragma once

#include <chrono>
#include <set>
#include <string>

namespace ronde::detail {

// The process's open socket descriptors.
std::set<int> open_sockets();

// Bounds every TCP connection to `port` opened since `before` (the client
// a store constructor made): a reply not read within `timeout` fails its
// recv() (c10d: "Socket Timeout"), and data the store's host does not
// acknowledge within `timeout` (a cut link) closes the connection, which
// fails the call in flight and every later one at once; keepalive probes
// find a cut link on an idle connection within the same bound.
void bound_store_connections(
    const std::set<int>& before, int port, std::chrono::milliseconds timeout);

// Returns once the server at the other end of every connection of this
// process to `port` has closed it (or after `timeout`), without reading
// from them: a failed read on a store client's connection makes c10d log
// a warning with a stack.
void wait_until_closed_by_server(int port, std::chrono::milliseconds timeout);

}  // namespace ronde::detail
