package g729

import "errors"

var errAlloc = errors.New("g729: bcg729 could not allocate a channel")
