package kamailio

import (
	"bytes"
	"fmt"
	"strings"
	"text/template"
)

// cfgTemplate is the whole kamailio.cfg: a stateful proxy that
// record-routes, sends every new INVITE to one destination and anchors the
// media on the rtpengine module's set, the way an operator's
// configuration does:
//
//   - an INVITE with SDP is an offer (rtpengine_offer), the SDP of the
//     reliable provisional or 2xx answer is the answer (rtpengine_answer);
//   - an INVITE without SDP is a late offer: the 2xx carries the offer, the
//     ACK the answer;
//   - BYE, CANCEL and a failed final response delete the call
//     (rtpengine_delete); at BYE the call's counters ($rtpstat, an ng query)
//     are logged first, and the MOS the module read from the delete reply
//     after.
//
// Options.Fallbacks are tried in turn when the destination before fails
// (a final response of 300 or more, or no final response within
// fr_inv_timer), as a B2BUA's route with several destinations does; the
// call's media is deleted only when the last has failed. With
// Options.NoMedia the configuration is the same proxy without the
// rtpengine module: SIP only.
//
// Log lines the package parses start with a word in capitals: OFFER,
// ANSWER, RTPSTAT, MOS, DELETE, NOMEDIA.
var cfgTemplate = template.Must(template.New("kamailio.cfg").Parse(`#!KAMAILIO
# Written by the lab (package lab/kamailio); not Debian's configuration.
debug={{.Debug}}
log_stderror=yes
log_prefix=""
children={{.Children}}
auto_aliases=no
disable_tcp=yes
dns=no
rev_dns=no
use_dns_cache=off
listen=udp:{{.Listen}}

mpath="{{.ModulePath}}"
loadmodule "tm.so"
loadmodule "tmx.so"
loadmodule "sl.so"
loadmodule "rr.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
loadmodule "siputils.so"
loadmodule "pv.so"
loadmodule "xlog.so"
{{- if .Media}}
loadmodule "rtpengine.so"
{{- end}}

modparam("tm", "fr_timer", {{.FinalResponseTimeoutMS}})
modparam("tm", "fr_inv_timer", {{.InviteTimeoutMS}})
modparam("rr", "append_fromtag", 1)

{{- if .Media}}
modparam("rtpengine", "rtpengine_sock", "{{.Sock}}")
modparam("rtpengine", "rtpengine_disable_tout", {{.DisableTimeout}})
modparam("rtpengine", "rtpengine_tout_ms", {{.TimeoutMS}})
modparam("rtpengine", "rtpengine_retr", {{.Retries}})
{{- if .QueriedNodesLimit}}
modparam("rtpengine", "queried_nodes_limit", {{.QueriedNodesLimit}})
{{- end}}
modparam("rtpengine", "hash_table_tout", 300)
modparam("rtpengine", "rtp_inst_pvar", "$avp(rtp_inst)")
modparam("rtpengine", "mos_average_pv", "$avp(mos_average)")
modparam("rtpengine", "mos_min_pv", "$avp(mos_min)")
modparam("rtpengine", "mos_max_pv", "$avp(mos_max)")
{{- end}}

request_route {
	if (!mf_process_maxfwd_header("10")) {
		sl_send_reply("483", "Too Many Hops");
		exit;
	}
	if (has_totag()) {
		route(WITHINDLG);
		exit;
	}
	if (is_method("CANCEL")) {
		if (t_check_trans()) {
{{- if .Media}}
			xlog("L_NOTICE", "DELETE ci=$ci cause=CANCEL\n");
			rtpengine_delete();
{{- end}}
			t_relay();
		}
		exit;
	}
	if (is_method("ACK")) {
		if (t_check_trans()) {
			t_relay();
		}
		exit;
	}
	if (!is_method("INVITE")) {
		sl_send_reply("405", "Method Not Allowed");
		exit;
	}
	if (t_check_trans()) {
		exit;
	}
	record_route();
{{- if .Media}}
	if (has_body("application/sdp")) {
		if (!rtpengine_offer("{{.Flags}} {{.CalleeFlags}}")) {
			xlog("L_ERR", "NOMEDIA ci=$ci offer\n");
			sl_send_reply("503", "Media Relay Unavailable");
			exit;
		}
		xlog("L_NOTICE", "OFFER ci=$ci node=$avp(rtp_inst) in=INVITE\n");
	} else {
		setflag(1);
	}
{{- end}}
	$du = "sip:{{.Destination}}";
	$avp(next) = 0;
	t_on_reply("REPLY");
	t_on_failure("FAILED");
	if (!t_relay()) {
		sl_reply_error();
	}
	exit;
}

route[WITHINDLG] {
	if (!loose_route()) {
		if (is_method("ACK") && t_check_trans()) {
			t_relay();
			exit;
		}
		sl_send_reply("404", "Not Here");
		exit;
	}
{{- if .Media}}
	if (is_method("BYE")) {
		$var(stat) = $rtpstat;
		xlog("L_NOTICE", "RTPSTAT ci=$ci node=$avp(rtp_inst) $var(stat)\n");
		rtpengine_delete();
		xlog("L_NOTICE", "MOS ci=$ci average=$avp(mos_average) min=$avp(mos_min) max=$avp(mos_max)\n");
	} else if (is_method("ACK") && has_body("application/sdp")) {
		if (rtpengine_answer("{{.Flags}} {{.CalleeFlags}}")) {
			xlog("L_NOTICE", "ANSWER ci=$ci node=$avp(rtp_inst) in=ACK\n");
		}
	} else if (is_method("INVITE") && has_body("application/sdp")) {
		rtpengine_offer("{{.Flags}} {{.CalleeFlags}}");
	}
{{- end}}
	if (is_method("INVITE")) {
		t_on_reply("REPLY");
	}
	if (!t_relay()) {
		sl_reply_error();
	}
	exit;
}

onreply_route[REPLY] {
{{- if .Media}}
	if (!is_method("INVITE") || !has_body("application/sdp") || $rs < 180 || $rs >= 300) {
		return;
	}
	if (isflagset(1)) {
		if (rtpengine_offer("{{.Flags}} {{.CallerFlags}}")) {
			xlog("L_NOTICE", "OFFER ci=$ci node=$avp(rtp_inst) in=$rs\n");
		} else {
			xlog("L_ERR", "NOMEDIA ci=$ci late offer\n");
		}
	} else if (rtpengine_answer("{{.Flags}} {{.CallerFlags}}")) {
		xlog("L_NOTICE", "ANSWER ci=$ci node=$avp(rtp_inst) in=$rs\n");
	}
{{- else}}
	return;
{{- end}}
}

failure_route[FAILED] {
{{- range $i, $d := .Fallbacks}}
	if (!t_is_canceled() && $avp(next) == {{$i}}) {
		$avp(next) = {{$i}} + 1;
		$du = "sip:{{$d}}";
		t_on_reply("REPLY");
		t_on_failure("FAILED");
		if (t_relay()) {
			exit;
		}
	}
{{- end}}
{{- if .Media}}
	xlog("L_NOTICE", "DELETE ci=$ci cause=$T_reply_code\n");
	rtpengine_delete();
{{- end}}
}
`))

// config renders kamailio.cfg for o.
func config(o *Options, modulePath string) ([]byte, error) {
	nodes := make([]string, len(o.RTPEngines))
	for i, n := range o.RTPEngines {
		nodes[i] = n.sock()
	}
	data := struct {
		Debug, Children                       int
		Listen, ModulePath, Destination, Sock string
		DisableTimeout, TimeoutMS, Retries    int
		QueriedNodesLimit                     int
		FinalResponseTimeoutMS                int
		InviteTimeoutMS                       int
		Flags, CalleeFlags, CallerFlags       string
		Media                                 bool
		Fallbacks                             []string
	}{
		Debug: o.Debug, Children: o.Children,
		Listen: o.Listen.String(), ModulePath: modulePath, Destination: o.Destination.String(),
		Sock:           strings.Join(nodes, " "),
		DisableTimeout: o.DisableTimeout, TimeoutMS: o.TimeoutMS, Retries: o.Retries,
		QueriedNodesLimit:      o.QueriedNodesLimit,
		FinalResponseTimeoutMS: o.FinalResponseTimeoutMS, InviteTimeoutMS: o.InviteTimeoutMS,
		Flags: strings.Join(o.Flags, " "), CalleeFlags: strings.Join(o.CalleeFlags, " "), CallerFlags: strings.Join(o.CallerFlags, " "),
		Media: !o.NoMedia,
	}
	for _, f := range o.Fallbacks {
		data.Fallbacks = append(data.Fallbacks, f.String())
	}
	for _, f := range [][]string{o.Flags, o.CalleeFlags, o.CallerFlags} {
		for _, s := range f {
			if strings.ContainsAny(s, "\"\\\n\r ") || s == "" {
				return nil, fmt.Errorf("rtpengine flag %q: empty or holds a space, quote, backslash or newline", s)
			}
		}
	}
	var b bytes.Buffer
	if err := cfgTemplate.Execute(&b, data); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
