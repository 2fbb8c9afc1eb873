package config

import (
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// keyLines maps each dotted key of a TOML document ("media.ports") to the
// line it is set on, for error messages. Tables map to their header line.
// It is best effort: on a parse error it returns what it found so far.
func keyLines(data []byte) map[string]int {
	lines := make(map[string]int)
	var p unstable.Parser
	p.Reset(data)
	var table []string
	// Array tables ([[route]]) also map "route[i]" and "route[i].key".
	arrays := make(map[string]int)
	indexed := ""
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table, _ = keyOf(&p, e.Key())
			indexed = ""
			if len(table) > 0 {
				name := strings.Join(table, ".")
				set(lines, name, e.Key(), &p)
				if e.Kind == unstable.ArrayTable {
					indexed = name + "[" + strconv.Itoa(arrays[name]) + "]"
					arrays[name]++
					set(lines, indexed, e.Key(), &p)
				}
			}
		case unstable.KeyValue:
			k, _ := keyOf(&p, e.Key())
			full := append(append([]string(nil), table...), k...)
			set(lines, strings.Join(full, "."), e.Key(), &p)
			if indexed != "" {
				set(lines, indexed+"."+strings.Join(k, "."), e.Key(), &p)
			}
		}
	}
	return lines
}

func keyOf(p *unstable.Parser, it unstable.Iterator) ([]string, int) {
	var parts []string
	line := 0
	for it.Next() {
		n := it.Node()
		parts = append(parts, string(n.Data))
		if line == 0 {
			line = p.Shape(n.Raw).Start.Line
		}
	}
	return parts, line
}

func set(lines map[string]int, key string, it unstable.Iterator, p *unstable.Parser) {
	if _, ok := lines[key]; ok {
		return
	}
	if _, line := keyOf(p, it); line > 0 {
		lines[key] = line
	}
}
