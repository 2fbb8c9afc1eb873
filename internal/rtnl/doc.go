// Package rtnl holds what relayd's watches of the kernel's network state
// share (Linux only): running code in a network namespace, subscribing to
// rtnetlink groups there, and following network interfaces by name.
package rtnl
