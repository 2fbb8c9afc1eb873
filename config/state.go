package config

import "path/filepath"

// State is the [state] section: where the calls relayd keeps across
// restarts are stored (control/state, docs/state.md).
type State struct {
	// Path of the store file, absolute; typically
	// /var/lib/relayd/state.db. Empty: calls are not kept, a restart
	// hangs them up.
	Path string `toml:"path"`
}

func (c *Config) validateState(bad func(key, format string, args ...any)) {
	if p := c.State.Path; p != "" && !filepath.IsAbs(p) {
		bad("state.path", "%q is not an absolute path", p)
	}
}
