#!/bin/sh
# version.sh: the Debian version of the checkout, from git describe.
#   tag v1.2.3 on HEAD          -> 1.2.3-1
#   5 commits after v1.2.3      -> 1.2.3+git5.abc1234-1
#   no tag                      -> 0.0~git<commits>.<hash>-1
#   uncommitted changes         -> ... +dirty before the revision
# "-1" is the Debian revision: the package is built from this tree, not a
# separate source package, but relayd is not a native Debian package.
set -eu
cd "$(dirname "$0")/../.."
if desc=$(git describe --tags --long --match 'v[0-9]*' 2>/dev/null); then
	hash=${desc##*-g}
	rest=${desc%-g*}
	n=${rest##*-}
	tag=${rest%-*}
	v=$(printf %s "${tag#v}" | tr -- '-_' '~~' | tr -cd 'A-Za-z0-9.+~')
	if [ "$n" != 0 ]; then
		v=$v+git$n.$hash
	fi
else
	v=0.0~git$(git rev-list --count HEAD).$(git rev-parse --short=7 HEAD)
fi
if ! git diff-index --quiet HEAD -- 2>/dev/null; then
	v=$v+dirty
fi
echo "$v-1"
