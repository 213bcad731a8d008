# Sourced by the device scripts: the libraries the GPU machine's image lacks
# (jansson, PCRE2, utf8proc, cmocka, libmicrohttpd for serve), from the Debian packages carried in
# .devdeps/ (apt-get download them here; the machine reaches no registry).
if ! pkg-config --exists jansson libpcre2-8 libutf8proc cmocka libmicrohttpd 2>/dev/null; then
    mkdir -p /tmp/deps
    for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/deps; done
    # libmicrohttpd's .pc names gnutls for static links only; the image has the library, not its .pc
    sed -i '/^Requires.private/d' /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc 2>/dev/null || true
    export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
    export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PATH=$PATH:/usr/local/cuda/bin
