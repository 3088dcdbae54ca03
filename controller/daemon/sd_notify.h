// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/daemon/sd_notify.h
// The systemd notification protocol (sd_notify(3)), written out so the daemon needs no libsystemd:
// one datagram of "KEY=VALUE\n" lines to the AF_UNIX socket named by $NOTIFY_SOCKET, a path or,
// starting with '@', a name in the abstract namespace. Without $NOTIFY_SOCKET nothing is sent, so
// the same binary runs under systemd (Type=notify, tools/systemd/kvctl.service), another
// supervisor or a terminal.
//
// Thread safety: SdNotify may be called from any thread; each call opens its own socket.
//
//   SdNotify("READY=1\nSTATUS=serving on ipc:///tmp/kvctl.sock");
#ifndef KVCTL_CONTROLLER_DAEMON_SD_NOTIFY_H_
#define KVCTL_CONTROLLER_DAEMON_SD_NOTIFY_H_

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvctl {

// Sends `state` to $NOTIFY_SOCKET. OK, and nothing sent, when the variable is unset or empty;
// INVALID_ARGUMENT for a name that is not a path or '@' name, or too long for sockaddr_un;
// UNAVAILABLE when the datagram cannot be sent (the manager is gone).
Status SdNotify(std::string_view state);

// "RELOADING=1\nMONOTONIC_USEC=<now>": the reload start message; systemd 253 and later match the
// READY=1 that ends a reload against this timestamp.
std::string SdReloadingState();

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_DAEMON_SD_NOTIFY_H_
