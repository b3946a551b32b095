#!/usr/bin/env bash
# Collects what building kiln on the GPU machine needs but that machine
# lacks (it has CUDA, CMake and Ninja, but none of Debian's -dev packages):
# the headers and shared libraries of jansson, xxhash, pcre2-8, OpenBLAS
# (with libgfortran and libquadmath, which OpenBLAS links) and libmicrohttpd
# (for `kiln serve`; it links GnuTLS, which that machine's Ubuntu has as
# libgnutls.so.30), and pkg-config files for them. Run it HERE, on the CPU machine, from the repository root;
# carry the result to the device with carry [".gpu-deps"]; tools/gpu-check.sh
# uses it. The .pc files locate the folder through ${pcfiledir}, so it works
# wherever it lands.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.gpu-deps"
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
libdir=/usr/lib/$multiarch
blasdir=$(pkg-config --variable=libdir openblas)
blasinc=$(pkg-config --variable=includedir openblas)

rm -rf "$out"
mkdir -p "$out/include" "$out/lib/pkgconfig"

# Headers.
for h in jansson.h jansson_config.h xxhash.h xxh3.h pcre2.h microhttpd.h; do
    cp -L "/usr/include/$h" "$out/include/"
done
for h in cblas.h f77blas.h openblas_config.h; do
    cp -L "$blasinc/$h" "$out/include/"
done

# Shared libraries: the real file under its soname plus the unversioned
# link name the linker looks for.
copy_lib() { # copy_lib PATH-TO-SO LINKNAME
    local real soname
    real=$(readlink -f "$1")
    soname=$(objdump -p "$real" | awk '/SONAME/ {print $2}')
    cp "$real" "$out/lib/$soname"
    [ -n "$2" ] && ln -sf "$soname" "$out/lib/$2"
    return 0
}
copy_lib "$libdir/libjansson.so" libjansson.so
copy_lib "$libdir/libxxhash.so" libxxhash.so
copy_lib "$libdir/libpcre2-8.so" libpcre2-8.so
copy_lib "$libdir/libmicrohttpd.so" libmicrohttpd.so
copy_lib "$blasdir/libopenblas.so" libopenblas.so
copy_lib "$libdir/libgfortran.so.5" ""
copy_lib "$libdir/libquadmath.so.0" ""

# pkg-config itself (pkgconf), for a machine that lacks it: gpu-check.sh
# puts it on PATH only when none is there.
mkdir -p "$out/bin"
cp "$(readlink -f "$(command -v pkg-config)")" "$out/bin/pkg-config"
copy_lib "$(ldd "$(readlink -f "$(command -v pkg-config)")" | awk '/libpkgconf/ {print $3}')" ""

pc() { # pc NAME VERSION LIBS
    cat > "$out/lib/pkgconfig/$1.pc" <<PC
prefix=\${pcfiledir}/../..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: $1
Description: $1 (copied from Debian by tools/gpu-deps.sh)
Version: $2
Cflags: -I\${includedir}
Libs: -L\${libdir} $3
PC
}
pc jansson "$(pkg-config --modversion jansson)" -ljansson
pc libxxhash "$(pkg-config --modversion libxxhash)" -lxxhash
pc libpcre2-8 "$(pkg-config --modversion libpcre2-8)" -lpcre2-8
pc libmicrohttpd "$(pkg-config --modversion libmicrohttpd)" -lmicrohttpd
pc openblas "$(pkg-config --modversion openblas)" -lopenblas

tar cJf "$root/.gpu-deps.tar.xz" -C "$root" .gpu-deps
du -sh "$out" | awk '{print "gpu-deps: " $1 " in .gpu-deps/"}'
echo "gpu-deps: packed as .gpu-deps.tar.xz (carry it with carry [\".gpu-deps.tar.xz\"]: gpu-check.sh unpacks it)"
