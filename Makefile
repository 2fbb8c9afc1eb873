# relayd. Run as root on Debian 12: the tests and the demo build network
# namespaces and load XDP programs. `make deps` installs what they need.

GO      ?= go
PREFIX  ?= /usr/local
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -X main.version=$(VERSION)
BIN     := bin

.PHONY: all deps deps-kmod need generate generate-check build lint test fuzz demo fwdemo soak bench deb deb-check deb-lint install uninstall clean

all: build

# Debian packages the build, tests and demo use. Packages that ship daemons
# must not start them: policy-rc.d refuses while we install.
# lintian checks the packages (make deb-check); nftables is what relayd
# -prepare drives; qemu-system-x86, busybox-static and kmod boot Debian's
# kernel for lab/vm; mmdebstrap and e2fsprogs build the Debian 12 guest of
# the appliance test (lab/appliance); promtool checks the metrics;
# keepalived and conntrackd run the firewall pair of lab/fwpair; tcpdump
# captures at its hosts (voipgen fwtest --capture and its tests);
# libbcg729-dev is G.729 for the transcoding workers (slowpath/codec/g729);
# ffmpeg is the independent G.729 and G.711 decoder of lab/audio.
DEBS := clang-16 llvm-16 libbpf-dev bpftool iproute2 ethtool tshark sip-tester gcc libsrtp2-dev rtpengine-daemon kamailio \
	qemu-system-x86 busybox-static kmod prometheus dpkg-dev lintian nftables mmdebstrap e2fsprogs keepalived conntrackd tcpdump libbcg729-dev ffmpeg
# rtpengine-kernel-dkms (rtpengine's kernel module source), rtpengine-iptables
# (its RTPENGINE target), iptables and linux-headers-amd64 (the headers of the
# kernel lab/vm boots, which the metapackage's linux-image-amd64 names) are for
# voipgen kmodbench only, which builds the module for that kernel and runs it
# in the guest (never loaded on the host): `make deps-kmod`, not part of
# `make deps` (dkms builds the module for every installed kernel's headers
# at install, time the test run does not need).
KMOD_DEBS := rtpengine-kernel-dkms rtpengine-iptables iptables linux-headers-amd64
deps-kmod: deps
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 $(KMOD_DEBS)
deps:
	@test -x /usr/sbin/policy-rc.d || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }
	DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=600
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 $(DEBS)
	@# rtpengine-daemon is only a peer to compare against, run by the tests
	@# on lab addresses: never let its packaged service start.
	-systemctl disable rtpengine-daemon.service >/dev/null 2>&1; systemctl mask rtpengine-daemon.service >/dev/null 2>&1; true
	@# kamailio (its rtpengine module is in the main package) is the SIP
	@# proxy of lab/kamailio, run by the tests with their own configuration.
	-systemctl disable kamailio.service >/dev/null 2>&1; systemctl mask kamailio.service >/dev/null 2>&1; true
	@# prometheus is installed for promtool (the metrics test); its server
	@# must not run either.
	-systemctl disable prometheus.service >/dev/null 2>&1; systemctl mask prometheus.service >/dev/null 2>&1; true
	@# keepalived and conntrackd run only inside lab/fwpair's namespaces,
	@# with the configuration the lab writes: never as services.
	-systemctl disable keepalived.service >/dev/null 2>&1; systemctl mask keepalived.service >/dev/null 2>&1; true
	-systemctl disable conntrackd.service >/dev/null 2>&1; systemctl mask conntrackd.service >/dev/null 2>&1; true
	$(GO) mod download

# Install the packages only when one is missing, so `make test` and
# `make demo` work on a fresh machine and cost nothing afterwards.
NEED_BINS := ip ethtool tshark sipp clang-16 bpftool qemu-system-x86_64 busybox modprobe promtool nft lintian mmdebstrap dpkg-shlibdeps keepalived conntrackd tcpdump ffmpeg
NEED_FILES := /usr/include/srtp2/srtp.h /usr/include/bcg729/encoder.h /usr/bin/rtpengine /usr/sbin/kamailio /usr/lib/x86_64-linux-gnu/kamailio/modules/rtpengine.so
need:
	@for b in $(NEED_BINS); do command -v $$b >/dev/null || { $(MAKE) deps; exit 0; }; done; \
	for f in $(NEED_FILES); do test -e $$f || { $(MAKE) deps; exit 0; }; done

# bpf2go with Debian's clang-16; the generated .go and .o are committed so
# `go build` needs no clang.
generate:
	$(GO) generate ./fastpath/ ./slowpath/ ./lab/minfwd/ ./lab/xdpsink/

# Regenerate and fail if the committed objects differ from the sources.
generate-check: generate
	@git diff --exit-code --stat -- fastpath/ slowpath/ lab/minfwd/ lab/xdpsink/ || { echo "generated BPF objects are stale: run make generate and commit"; exit 1; }

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./voipgen/cmd/...

lint:
	$(GO) vet ./... ./voipgen/...
	$(GO) tool staticcheck ./... ./voipgen/...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

# All tests, root-only ones included (they skip only where the capability
# is missing, and say why). Fuzz corpora in testdata/ run as regression tests.
# internal/testreport runs go test, lists every skipped test with its reason
# and the slowest tests, and with CI set fails the run on a skip that is not
# in .ci/skips.
# One package at a time (-p 1): the lab tests measure timing (glitches,
# pacing, setup times) and would measure each other on a 2-core machine.
# But lab/labrelay runs in a second go test beside BESIDE_PKGS: they are
# wall-clock bound (calls paced in real time, failover timers) and light
# (0.16-0.35 CPUs each, measured over a CI run), and each lab lives in
# namespaces named by its process, with its binaries, pins and daemons'
# files in temporary directories. What measures CPU (voipgen/bench) or
# keeps both CPUs busy (the guests of lab/appliance and lab/vm) runs alone.
# The SIP packages, relayd's B2BUA and voipgen's user agent, and the
# daemon's start and stop (cmd/relayd, control/admin) run under the race
# detector instead: the SIP packages drive sipgo from many goroutines, and
# an unsynchronised map access there is the runtime's fatal error, not a
# failed test (voipgen's registered its handlers while serving, and read
# sipgo's listen ports unlocked, and died so now and then).
RACE_PKGS := github.com/relayd/relayd/control/sip github.com/relayd/relayd/voipgen/sipua \
	github.com/relayd/relayd/control/admin github.com/relayd/relayd/cmd/relayd github.com/relayd/relayd/internal/sipgolog
BESIDE_PKGS := github.com/relayd/relayd/lab/kamailio github.com/relayd/relayd/lab/fwpair \
	github.com/relayd/relayd/voipgen/fwtest github.com/relayd/relayd/voipgen/gen
ALONE_EXCLUDE := $(RACE_PKGS) $(BESIDE_PKGS) github.com/relayd/relayd/lab/labrelay
# Lines printed even when the test passes: how long the appliance guest
# ran, whether its kernel locked up (a second boot), and each check's time,
# which say where CI's time went.
TEST_SHOW := figure (guest_run_s|guest_lockups|check_[a-z0-9_]+_ms)=
test: need
	$(GO) vet ./... ./voipgen/...
	$(GO) run ./internal/testreport -allow .ci/skips -- -race -p 1 -count=1 -timeout 10m $(RACE_PKGS)
	$(GO) run ./internal/testreport -allow .ci/skips -show '$(TEST_SHOW)' -- -p 1 -count=1 -timeout 30m $$($(GO) list ./... ./voipgen/... | grep -vxF $(ALONE_EXCLUDE:%=-e %))
	@out=$$(mktemp); \
	echo "lab/labrelay, and beside it: $(BESIDE_PKGS:github.com/relayd/relayd/%=%) (their report follows labrelay's)"; \
	$(GO) run ./internal/testreport -allow .ci/skips -- -p 1 -count=1 -timeout 30m $(BESIDE_PKGS) > $$out 2>&1 & beside=$$!; \
	st=0; $(GO) run ./internal/testreport -allow .ci/skips -- -p 1 -count=1 -timeout 30m github.com/relayd/relayd/lab/labrelay || st=1; \
	wait $$beside || st=1; cat $$out; rm -f $$out; exit $$st

# Short fuzzing session on every fuzz target of both modules (package:target;
# `grep -rn "func Fuzz" --include=*_test.go .` lists them), each in a network
# namespace of its own with only loopback: the SIP and ng fuzzers run real
# servers, and no mutated message may make anything leave the machine.
FUZZTIME ?= 20s
fuzz:
	@set -e; for t in \
		fastpath:FuzzXDP slowpath:FuzzProcess slowpath/codec/g729:FuzzDecode config:FuzzParse control/admin:FuzzPostFlow control/admin:FuzzDrain \
		control/sdp:FuzzRewrite control/ng/bencode:FuzzDecode control/ng/bencode:FuzzRoundTrip \
		control/ng:FuzzServeDatagram control/ng:FuzzParseRequest control/ng:FuzzCallEngine \
		rtp:FuzzHeaderUnmarshal rtp:FuzzRTCPUnmarshal rtp:FuzzReceiverStats rtp:FuzzStreamAnalyzer sdes:FuzzParse \
		voipgen/sipua:FuzzParseSDP voipgen/gen:FuzzParseEndpoints slowpath/transcode:FuzzPush slowpath/srtpflow:FuzzDifferential control/sip:FuzzDatagram control/sip:FuzzVet; do \
		echo "== $$t"; unshare -n sh -c "ip link set lo up && exec $(GO) test -run '^$$' -fuzz '^$${t#*:}$$' -fuzztime $(FUZZTIME) ./$${t%%:*}/"; \
	done

# The main job: calls through the relay in the lab, with the report; then
# the short comparison (XDP against userspace, SIP calls and two steps of
# concurrent calls): the table, and plots in $(BENCH_OUT).
BENCH_OUT ?= /tmp/relayd-bench
demo: need
	$(GO) run ./voipgen/cmd/voipgen demo
	$(GO) run ./voipgen/cmd/voipgen bench --modes xdp,userspace --calls 250,1000 --sip-calls 50 --sip-duration 3s --quiet-wait 10s --out $(BENCH_OUT)

# The test engineer's experiment, short: a redundant firewall pair
# (keepalived VRRP, conntrackd) in namespaces, its zero-loss rate and the
# glitch of an administrative and of a crash failover, with and without
# conntrackd; the table, and report.json and plots in $(FW_OUT).
FW_OUT ?= /tmp/relayd-fwtest
fwdemo: need
	$(GO) run ./voipgen/cmd/voipgen fwtest --quick --out $(FW_OUT)

# The soak: 1,000 SIP calls with media through relayd's XDP for 10 minutes
# under spoofed media and malformed SIP from a stranger; the report (and
# $(SOAK_OUT) as JSON) says whether media was lost, the heap after GC grew,
# the goroutines changed or relayd restarted, and the exit status fails if so.
SOAK_OUT ?= /tmp/relayd-soak.json
soak: need
	$(GO) run ./voipgen/cmd/voipgen soak --out $(SOAK_OUT)

# Benchmarks: the XDP program's ns per packet (BPF_PROG_TEST_RUN), the Go
# hot paths (RTP, voipgen's packet build and the checksum it shares in
# internal/pktio, the userspace workers' batch, SRTP and transcoding in
# slowpath), voipgen's senders and receiver in the lab (pps offered
# and sent, lateness, CPU per packet: BenchmarkLabSender*), then the
# forwarding limit and CPU per packet in the lab, then the full comparison
# over concurrent calls (xdp, userspace, srtp and rtpengine; table,
# bench.json and plots in $(BENCH_OUT)).
bench: need
	$(GO) test -run '^$$' -bench . -benchmem ./fastpath/ ./rtp/... ./internal/pktio/ ./voipgen/gen/ ./slowpath/...
	$(GO) run ./voipgen/cmd/voipgen fwdbench
	$(GO) run ./voipgen/cmd/voipgen bench --with-rtpengine --repeat 3 --out $(BENCH_OUT)

# Debian packages, built with dpkg-deb over staged trees
# (packaging/deb/build.sh): relayd (daemon, relayctl, unit, conffile) and
# relayd-tools (voipgen). DEB_VERSION comes from git describe.
DIST        ?= dist
DEB_VERSION ?= $(shell packaging/deb/version.sh)
DEB_BIN     := $(BIN)/deb
# Debian's hardening flags for the cgo parts, linked externally so they
# apply (PIE, RELRO, BIND_NOW, fortify, stack protector).
DEB_CGO_CFLAGS  := $(shell DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get CFLAGS 2>/dev/null) $(shell DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get CPPFLAGS 2>/dev/null)
DEB_CGO_LDFLAGS := $(shell DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get LDFLAGS 2>/dev/null)
deb:
	rm -rf $(DEB_BIN)
	CGO_CFLAGS="$(DEB_CGO_CFLAGS)" CGO_LDFLAGS="$(DEB_CGO_LDFLAGS)" \
		$(GO) build -trimpath -buildmode=pie -ldflags "$(LDFLAGS) -s -w -linkmode=external -extldflags '$(DEB_CGO_LDFLAGS)'" \
		-o $(DEB_BIN)/ ./cmd/relayd ./cmd/relayctl ./voipgen/cmd/voipgen
	rm -f $(DIST)/relayd_*.deb $(DIST)/relayd-tools_*.deb
	packaging/deb/build.sh $(DEB_VERSION) $(DEB_BIN) $(DIST)

# lintian on both packages; the overrides in packaging/deb say why each
# remaining tag is accepted. deb-lint checks the packages already in
# $(DIST) (CI builds them beside lint, then checks them).
deb-check: deb
	$(MAKE) deb-lint
deb-lint:
	lintian --fail-on error,warning --display-info $(DIST)/relayd_$(DEB_VERSION)_amd64.deb $(DIST)/relayd-tools_$(DEB_VERSION)_amd64.deb

# The files the relayd package installs (not voipgen: a test tool, in
# relayd-tools), under PREFIX; the unit runs $(PREFIX)/bin/relayd. Prefer
# the package (make deb) on Debian.
install: build
	install -D -m 0755 $(BIN)/relayd $(DESTDIR)$(PREFIX)/bin/relayd
	install -D -m 0755 $(BIN)/relayctl $(DESTDIR)$(PREFIX)/bin/relayctl
	install -d $(DESTDIR)/etc/systemd/system
	sed 's|/usr/bin/relayd|$(PREFIX)/bin/relayd|g' systemd/relayd.service > $(DESTDIR)/etc/systemd/system/relayd.service
	install -D -m 0644 systemd/relayd-sysctl.conf $(DESTDIR)/etc/sysctl.d/60-relayd.conf
	install -D -m 0644 systemd/relayd-tmpfiles.conf $(DESTDIR)/etc/tmpfiles.d/relayd.conf
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man8
	gzip -9nc docs/man/relayd.8 > $(DESTDIR)$(PREFIX)/share/man/man8/relayd.8.gz
	gzip -9nc docs/man/relayctl.1 > $(DESTDIR)$(PREFIX)/share/man/man1/relayctl.1.gz
	gzip -9nc docs/man/relayd.toml.5 > $(DESTDIR)$(PREFIX)/share/man/man5/relayd.toml.5.gz
	@if [ -e $(DESTDIR)/etc/relayd/relayd.toml ]; then \
		echo "keeping existing /etc/relayd/relayd.toml"; \
	else \
		install -D -m 0644 systemd/relayd.toml $(DESTDIR)/etc/relayd/relayd.toml; \
	fi
	@if [ -z "$(DESTDIR)" ] && command -v systemctl >/dev/null; then systemctl daemon-reload || true; fi
	@echo "edit /etc/relayd/relayd.toml (dataplane.interfaces, media.address), then: systemctl enable --now relayd"

uninstall:
	-systemctl disable --now relayd 2>/dev/null
	-$(DESTDIR)$(PREFIX)/bin/relayd -detach -config /etc/relayd/relayd.toml
	rm -f $(DESTDIR)$(PREFIX)/bin/relayd $(DESTDIR)$(PREFIX)/bin/relayctl
	rm -f $(DESTDIR)$(PREFIX)/share/man/man8/relayd.8.gz $(DESTDIR)$(PREFIX)/share/man/man1/relayctl.1.gz $(DESTDIR)$(PREFIX)/share/man/man5/relayd.toml.5.gz
	rm -f $(DESTDIR)/etc/systemd/system/relayd.service $(DESTDIR)/etc/sysctl.d/60-relayd.conf $(DESTDIR)/etc/tmpfiles.d/relayd.conf

clean:
	rm -rf $(BIN) $(DIST)
