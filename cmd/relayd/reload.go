package main

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/internal/secret"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/route"
)

// reloader applies a re-read config on SIGHUP (systemctl reload): the log
// level, the routes, the route server and the users of [sip] auth_file
// (the file is read again) take effect at once, without touching calls;
// every other key that changed is named in a warning as needing a
// restart.
type reloader struct {
	path   string
	log    *zap.Logger
	level  zap.AtomicLevel
	router *route.Router // nil without the B2BUA
	admin  *admin.Server // nil before the admin API starts
	// setCredentials replaces the B2BUA's digest users; nil without it.
	setCredentials func(*config.Credentials)

	cur *config.Config // what is applied; reload's goroutine only
}

// reloadable reports whether a reload applies key: log.level, the
// [[route]] tables, the [route_server] section and admin.token_file.
func reloadable(key string) bool {
	return key == "log.level" || key == "route" || strings.HasPrefix(key, "route_server.") || key == "admin.token_file"
}

// reload re-reads the config file and applies it. A config that does not
// load changes nothing.
func (r *reloader) reload() error {
	next, err := config.Load(r.path)
	if err != nil {
		return err // names the file, line and key
	}
	for _, w := range next.Warnings() {
		r.log.Warn("config: "+w, zap.String("config", r.path))
	}
	// The token file is read again whatever changed: rotating the token
	// is writing the file and reloading.
	if err := r.reloadToken(next.Admin.TokenFile); err != nil {
		return err
	}
	r.cur.Admin.TokenFile = next.Admin.TokenFile
	changed := changedKeys(r.cur, next)
	// The users come from the file, which changes without the config.
	credentials := next.SIP.AuthFile == r.cur.SIP.AuthFile && !next.SIP.Credentials.Equal(r.cur.SIP.Credentials)
	if credentials {
		// Before the routes: a new route may name a new user.
		if r.setCredentials != nil {
			r.setCredentials(next.SIP.Credentials)
			r.log.Info("auth_file reloaded", zap.String("auth_file", next.SIP.AuthFile), zap.Int("users", next.SIP.Credentials.Len()))
		}
		r.cur.SIP.Credentials = next.SIP.Credentials
	}
	if len(changed) == 0 {
		if !credentials {
			r.log.Info("config reloaded: nothing changed", zap.String("config", r.path))
		}
		return nil
	}
	var applied, restart []string
	for _, k := range changed {
		if reloadable(k) {
			applied = append(applied, k)
		} else {
			restart = append(restart, k)
		}
	}
	if slices.ContainsFunc(applied, func(k string) bool { return k == "route" || strings.HasPrefix(k, "route_server.") }) {
		if r.router == nil {
			restart = append(restart, "route (the SIP B2BUA is off)")
		} else if err := r.router.Reload(next.Routes, next.RouteServer); err != nil {
			return fmt.Errorf("reload routes: %w", err)
		}
		r.cur.Routes, r.cur.RouteServer = next.Routes, next.RouteServer
	}
	if slices.Contains(applied, "log.level") {
		lvl, err := zapcore.ParseLevel(next.Log.Level)
		if err != nil {
			return fmt.Errorf("reload log level: %w", err)
		}
		r.level.SetLevel(lvl)
		r.cur.Log.Level = next.Log.Level
	}
	r.log.Info("config reloaded", zap.String("config", r.path), zap.Strings("applied", applied))
	if len(restart) > 0 {
		r.log.Warn("config changes that need a restart (systemctl restart relayd) were not applied",
			zap.String("config", r.path), zap.Strings("keys", restart))
	}
	return nil
}

// reloadToken applies the admin token in path ("" asks for none).
func (r *reloader) reloadToken(path string) error {
	if r.admin == nil {
		return nil
	}
	var token string
	if path != "" {
		var err error
		if token, err = secret.ReadToken(path); err != nil {
			return fmt.Errorf("admin.token_file: %w", err)
		}
	}
	r.admin.SetToken(token)
	if path != "" {
		r.log.Info("admin API token read again", zap.String("token_file", path))
	}
	return nil
}

// changedKeys names the config keys whose values differ between a and b:
// "section.key" for the keys of a section, "section" for arrays of tables
// ([[route]]) and whole-section values.
func changedKeys(a, b *config.Config) []string {
	var out []string
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := range va.NumField() {
		f := va.Type().Field(i)
		name := tomlName(f)
		if name == "" {
			continue
		}
		fa, fb := va.Field(i), vb.Field(i)
		if f.Type.Kind() != reflect.Struct {
			if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
				out = append(out, name)
			}
			continue
		}
		for j := range fa.NumField() {
			sf := f.Type.Field(j)
			key := tomlName(sf)
			if key == "" {
				continue
			}
			if !reflect.DeepEqual(fa.Field(j).Interface(), fb.Field(j).Interface()) {
				out = append(out, name+"."+key)
			}
		}
	}
	return out
}

// tomlName returns a field's TOML key, "" for fields not in the file.
func tomlName(f reflect.StructField) string {
	tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if tag == "-" || !f.IsExported() {
		return ""
	}
	if tag == "" {
		return strings.ToLower(f.Name)
	}
	return tag
}
