// The photo portrait drawn in the browser with WebGL from the rig the gateway serves
// (/portrait/rig.json + photo.png, built by export/portrait/rig.py), so a session costs
// the server no pixels. It draws the model of networks/portrait.py (PortraitRenderer):
//   vertices = rest + sum_k w_k * offset_k, turned about the pivot by each vertex's rigidity
//   the mesh drawn forward, textured with the photo at the rest positions
//   the mouth interior painted between the inner lips (_paint_mouth, same formulas)
// A blink needs no lid layer here (_cover_eyes): drawn forward, the squeezed eye's
// triangles shrink to nothing under the lid.
// Coordinates are pixels of the S x S photo, x right, y down, pixel centres at integers.
"use strict";

window.Portrait = (() => {
  // Rig pixel p -> clip space. Pixel centres are integers in the rig (align_corners) and
  // at +0.5 in GL window coordinates, so a vertex at rest samples the photo texel it sits on.
  const MESH_VERTEX = `
    attribute vec3 aPos;   // posed x, y, z (px; smaller z is nearer)
    attribute vec2 aRest;  // rest x, y: where the vertex sits in the photo
    uniform float uSize;
    varying vec2 vUv;
    void main() {
      vec2 ndc = (aPos.xy + 0.5) / uSize * 2.0 - 1.0;
      gl_Position = vec4(ndc.x, -ndc.y, clamp(aPos.z / uSize, -1.0, 1.0), 1.0);
      vUv = (aRest + 0.5) / uSize;
    }`;
  const MESH_FRAGMENT = `
    precision highp float;
    uniform sampler2D uPhoto;
    varying vec2 vUv;
    void main() { gl_FragColor = vec4(texture2D(uPhoto, vUv).rgb, 1.0); }`;
  const MOUTH_VERTEX = `
    attribute vec3 aPos;
    uniform float uSize;
    void main() {
      vec2 ndc = (aPos.xy + 0.5) / uSize * 2.0 - 1.0;
      gl_Position = vec4(ndc.x, -ndc.y, 0.0, 1.0);
    }`;
  // PortraitRenderer._paint_mouth per pixel: in the mouth's frame (a along the
  // corner-to-corner axis, b across it, down) the inner lips are b_u(a), b_l(a),
  // piecewise linear through the 11 posed points of each; the interior lies between them
  // where they are further apart than at rest. Colours are 0..1 here, 0..255 there.
  const MOUTH_FRAGMENT = `
    precision highp float;
    uniform vec2 uUpper[11];
    uniform vec2 uLower[11];
    uniform float uRestGaps[11];  // the photo's opening per column of the inner lips
    uniform float uSize, uTeeth;
    uniform vec3 uCavity, uTeethColor, uTongue, uGum;
    vec2 start, along, across;
    const float TOOTH_SLOPE = 2.33, TOOTH_CURVE = 3.33, LOWER_TEETH = 1.35;  // as there

    vec2 toFrame(vec2 p) { vec2 r = p - start; return vec2(dot(r, along), dot(r, across)); }
    // one segment's share of networks.portrait._interp (a sum of clamped ramps)
    float ramp(float a, vec2 p, vec2 q) {
      float seg = max(q.x - p.x, 1e-3);
      return min(max(a - p.x, 0.0), seg) * (q.y - p.y) / seg;
    }
    float sq(float x) { return x * x; }
    // networks.portrait._seam: 1 between two teeth, 0 in a tooth's middle
    float seamOf(float tooth) { return 0.5 + 0.5 * cos(6.283185307179586 * tooth); }
    // networks.portrait._teeth: (coverage, shade) of one row of teeth
    vec2 teethRow(float seam, float len, float fromLip, float light) {
      float seam2 = seam * seam, seam8 = sq(sq(seam2));
      float body = clamp(len * (1.0 - 0.2 * seam2) - fromLip + 0.5, 0.0, 1.0);
      float shadow = 0.72 + 0.28 * clamp(fromLip / (0.5 * len + 1.0), 0.0, 1.0);
      return vec2(body, light * shadow * (1.0 - 0.1 * seam - 0.35 * seam8));
    }

    void main() {
      vec2 pixel = vec2(gl_FragCoord.x - 0.5, uSize - gl_FragCoord.y - 0.5);
      start = (uUpper[0] + uLower[0]) * 0.5;
      vec2 end = (uUpper[10] + uLower[10]) * 0.5;
      float width = max(length(end - start), 1.0);
      along = (end - start) / width;
      across = vec2(-along.y, along.x);
      vec2 ab = toFrame(pixel);
      float a = ab.x, b = ab.y;
      vec2 u0 = toFrame(uUpper[0]), l0 = toFrame(uLower[0]);
      float bUp = u0.y, bLow = l0.y, rest = uRestGaps[0];
      for (int k = 1; k < 11; k++) {
        vec2 u1 = toFrame(uUpper[k]), l1 = toFrame(uLower[k]);
        bUp += ramp(a, u0, u1);
        bLow += ramp(a, l0, l1);
        rest += ramp(a, vec2(u0.x, uRestGaps[k - 1]), vec2(u1.x, uRestGaps[k]));
        u0 = u1;
        l0 = l1;
      }
      float gap = bLow - bUp;
      float keep = rest / 2.0;  // the photo's own interior next to each lip
      float opened = clamp((gap - rest - 0.5) / 1.5, 0.0, 1.0);
      float inside = clamp(b - bUp - keep + 0.5, 0.0, 1.0) * clamp(bLow - keep - b + 0.5, 0.0, 1.0) * opened;
      if (inside <= 0.0) discard;
      float depth = clamp((b - bUp) / max(gap, 1.0), 0.0, 1.0);
      float centre = a - width / 2.0;
      float lateral = clamp((0.36 * width - abs(centre)) / 2.0 + 0.5, 0.0, 1.0);
      float tongueY = (b - (bLow - 0.2 * gap)) / max(0.35 * gap, 1.0);
      float tongue = clamp(4.0 * (1.0 - sq(centre / (0.32 * width)) - sq(tongueY)), 0.0, 1.0);
      vec3 color = uCavity * (0.55 + 0.9 * abs(depth - 0.5));
      color += (uTongue - color) * tongue;
      // the teeth template: gaps, rounded tips, the lips' shadow, darker to the sides
      float x = abs(centre) / (width / 2.0);
      float tooth = x * (TOOTH_SLOPE + TOOTH_CURVE * x);
      float side = max(1.0 - 0.35 * sq(centre / (0.4 * width)), 0.5);
      float seam = seamOf(tooth);
      float gum = clamp(0.5 * (0.45 * gap - uTeeth), 0.0, 0.3 * uTeeth) * clamp(1.0 - keep, 0.0, 1.0);
      float down = b - bUp - keep;
      vec2 upper = teethRow(seam, max(min(0.45 * gap, uTeeth) - keep, 0.0), down - gum, side);
      color += (uTeethColor * upper.y - color) * upper.x * lateral;
      vec2 lower = teethRow(seamOf(LOWER_TEETH * tooth), max(min(0.25 * gap, 0.6 * uTeeth) - keep, 0.0),
                            bLow - keep - b, 0.78 * side);
      color += (uTeethColor * lower.y - color) * lower.x * lateral;
      float gums = clamp(gum * (1.0 + 0.6 * seam * seam) - down + 0.5, 0.0, 1.0);
      color += (uGum * side - color) * gums * lateral;
      gl_FragColor = vec4(color, inside);  // blended over the photo by 'inside'
    }`;

  function program(gl, vertexSource, fragmentSource) {
    const made = gl.createProgram();
    for (const [type, source] of [[gl.VERTEX_SHADER, vertexSource], [gl.FRAGMENT_SHADER, fragmentSource]]) {
      const shader = gl.createShader(type);
      gl.shaderSource(shader, source);
      gl.compileShader(shader);
      if (!gl.getShaderParameter(shader, gl.COMPILE_STATUS)) throw new Error("shader: " + gl.getShaderInfoLog(shader));
      gl.attachShader(made, shader);
    }
    gl.bindAttribLocation(made, 0, "aPos");  // both programs read positions from attribute 0
    gl.bindAttribLocation(made, 1, "aRest");
    gl.linkProgram(made);
    if (!gl.getProgramParameter(made, gl.LINK_STATUS)) throw new Error("link: " + gl.getProgramInfoLog(made));
    const uniform = (name) => gl.getUniformLocation(made, name);
    return { made, uniform };
  }

  function buffer(gl, target, data, usage = gl.STATIC_DRAW) {
    const b = gl.createBuffer();
    gl.bindBuffer(target, b);
    gl.bufferData(target, data, usage);
    return b;
  }

  async function loadPhoto(url) {
    const image = new Image();
    image.src = url;
    await image.decode();
    return image;
  }

  // The rig (parsed rig.json) -> the posing function of PortraitRenderer.posed_vertices,
  // on the CPU: a few hundred vertices take microseconds, and the mouth pass needs the
  // posed lip points as uniforms anyway.
  function poser(rig) {
    const count = rig.vertices.length / 3, rest = Float32Array.from(rig.vertices);
    const offsets = rig.offsets.map((o) => ({ index: Int32Array.from(o.index), xyz: Float32Array.from(o.xyz) }));
    const rigidity = Float32Array.from(rig.rigidity), [px, py, pz] = rig.pivot;
    const moved = new Float32Array(3 * count), posed = new Float32Array(3 * count);
    return (weights, yaw, pitch, roll) => {
      moved.set(rest);
      weights.forEach((w, k) => {
        if (!w) return;
        const { index, xyz } = offsets[k];
        for (let i = 0; i < index.length; i++) {
          for (let c = 0; c < 3; c++) moved[3 * index[i] + c] += w * xyz[3 * i + c];
        }
      });
      const cy = Math.cos(yaw), sy = Math.sin(yaw), cp = Math.cos(pitch), sp = Math.sin(pitch);
      const cr = Math.cos(roll), sr = Math.sin(roll);
      for (let v = 0; v < count; v++) {
        const mx = moved[3 * v], my = moved[3 * v + 1], mz = moved[3 * v + 2];
        const x = mx - px, y = my - py, z = mz - pz;
        // yaw about the vertical axis, pitch about the horizontal, roll in the image plane
        const x1 = x * cy - z * sy, z1 = x * sy + z * cy;
        const y2 = y * cp + z1 * sp, z2 = z1 * cp - y * sp;  // z2: depth for the depth test only
        const x3 = x1 * cr - y2 * sr, y3 = x1 * sr + y2 * cr;
        const r = rigidity[v];
        posed[3 * v] = mx + r * (x3 + px - mx);
        posed[3 * v + 1] = my + r * (y3 + py - my);
        posed[3 * v + 2] = mz + r * (z2 + pz - mz);
      }
      return posed;
    };
  }

  // canvas: a fresh canvas (its WebGL context is made here); info: /portrait/info.
  // -> { draw(w, force): draws the face for w(name) (ARKit weights, headYaw/Pitch/Roll),
  //      only when they changed unless force; true when it drew }. Throws when it cannot.
  async function create(canvas, info) {
    const [rig, photo] = await Promise.all([
      fetch(info.rig).then((r) => { if (!r.ok) throw new Error(`rig.json: HTTP ${r.status}`); return r.json(); }),
      loadPhoto(info.photo),
    ]);
    const size = rig.size, count = rig.vertices.length / 3;
    if (photo.naturalWidth !== size || photo.naturalHeight !== size) throw new Error(`photo is not ${size}x${size}`);
    if (count > 65535) throw new Error("rig has more vertices than 16-bit indices address");
    canvas.width = canvas.height = size;
    // alpha: false, so that blending the mouth never makes the page show through
    const gl = canvas.getContext("webgl", { alpha: false, antialias: false, depth: true });
    if (!gl) throw new Error("WebGL is not available");

    const mesh = program(gl, MESH_VERTEX, MESH_FRAGMENT), mouth = program(gl, MOUTH_VERTEX, MOUTH_FRAGMENT);
    const texture = gl.createTexture();
    gl.bindTexture(gl.TEXTURE_2D, texture);
    // the photo's bytes as they are: no colour-profile conversion, no premultiplication
    gl.pixelStorei(gl.UNPACK_COLORSPACE_CONVERSION_WEBGL, gl.NONE);
    gl.pixelStorei(gl.UNPACK_PREMULTIPLY_ALPHA_WEBGL, false);
    gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGB, gl.RGB, gl.UNSIGNED_BYTE, photo);
    for (const [key, value] of [[gl.TEXTURE_MIN_FILTER, gl.LINEAR], [gl.TEXTURE_MAG_FILTER, gl.LINEAR],
      [gl.TEXTURE_WRAP_S, gl.CLAMP_TO_EDGE], [gl.TEXTURE_WRAP_T, gl.CLAMP_TO_EDGE]]) gl.texParameteri(gl.TEXTURE_2D, key, value);

    const restXY = new Float32Array(2 * count);
    for (let v = 0; v < count; v++) { restXY[2 * v] = rig.vertices[3 * v]; restXY[2 * v + 1] = rig.vertices[3 * v + 1]; }
    const positions = buffer(gl, gl.ARRAY_BUFFER, new Float32Array(3 * count), gl.DYNAMIC_DRAW);
    const rests = buffer(gl, gl.ARRAY_BUFFER, restXY);
    const triangles = buffer(gl, gl.ELEMENT_ARRAY_BUFFER, Uint16Array.from(rig.triangles));
    // The whole photo at rest, drawn first: the border vertices sit on pixel centres 0 and
    // S-1, so the mesh leaves half a pixel at the edges, which never move anyway.
    const e = size - 0.5, q = -0.5;
    const full = buffer(gl, gl.ARRAY_BUFFER, new Float32Array([q, q, 0, e, q, 0, q, e, 0, e, e, 0]));
    const fullRest = buffer(gl, gl.ARRAY_BUFFER, new Float32Array([q, q, e, q, q, e, e, e]));

    gl.useProgram(mesh.made);
    gl.uniform1f(mesh.uniform("uSize"), size);
    gl.uniform1i(mesh.uniform("uPhoto"), 0);
    gl.useProgram(mouth.made);
    const m = rig.mouth, rgb = (name) => m.colors[name].map((c) => c / 255);
    gl.uniform1f(mouth.uniform("uSize"), size);
    // networks.portrait: the rest vertices' distance per column of the inner lips
    const restGaps = m.upper.map((u, i) => {
      const l = m.lower[i];
      return Math.hypot(rig.vertices[3 * l] - rig.vertices[3 * u], rig.vertices[3 * l + 1] - rig.vertices[3 * u + 1]);
    });
    gl.uniform1fv(mouth.uniform("uRestGaps"), restGaps);
    gl.uniform1f(mouth.uniform("uTeeth"), m.teeth);
    gl.uniform3fv(mouth.uniform("uCavity"), rgb("cavity"));
    gl.uniform3fv(mouth.uniform("uTeethColor"), rgb("teeth"));
    gl.uniform3fv(mouth.uniform("uTongue"), rgb("tongue"));
    gl.uniform3fv(mouth.uniform("uGum"), rgb("gum"));
    const lipUniforms = [mouth.uniform("uUpper"), mouth.uniform("uLower")];
    const lips = [new Float32Array(22), new Float32Array(22)];

    const pose = poser(rig), names = rig.names;
    const last = new Float32Array(names.length + 3).fill(NaN), now = new Float32Array(names.length + 3);
    let lost = false;
    canvas.addEventListener("webglcontextlost", (event) => { event.preventDefault(); lost = true; });

    function attributes(position, rest) {
      gl.bindBuffer(gl.ARRAY_BUFFER, position);
      gl.vertexAttribPointer(0, 3, gl.FLOAT, false, 0, 0);
      gl.enableVertexAttribArray(0);
      gl.bindBuffer(gl.ARRAY_BUFFER, rest);
      gl.vertexAttribPointer(1, 2, gl.FLOAT, false, 0, 0);
      gl.enableVertexAttribArray(1);
    }

    function draw(w, force = false) {
      if (lost) throw new Error("the WebGL context was lost");
      names.forEach((n, k) => (now[k] = w(n)));
      now.set([w("headYaw"), w("headPitch"), w("headRoll")], names.length);
      if (!force && now.every((v, i) => v === last[i])) return false;  // nothing moved
      last.set(now);
      const posed = pose(now.subarray(0, names.length), ...now.subarray(names.length));
      gl.viewport(0, 0, size, size);
      gl.clearColor(0, 0, 0, 1);
      gl.clear(gl.COLOR_BUFFER_BIT | gl.DEPTH_BUFFER_BIT);
      gl.disable(gl.BLEND);
      gl.disable(gl.SCISSOR_TEST);

      gl.useProgram(mesh.made);
      gl.activeTexture(gl.TEXTURE0);
      gl.bindTexture(gl.TEXTURE_2D, texture);
      gl.disable(gl.DEPTH_TEST);
      attributes(full, fullRest);
      gl.drawArrays(gl.TRIANGLE_STRIP, 0, 4);
      // where the moved mesh folds over itself (a turned nose over the far cheek) the
      // nearer surface wins: the depth test on the posed z
      gl.enable(gl.DEPTH_TEST);
      gl.bindBuffer(gl.ARRAY_BUFFER, positions);
      gl.bufferSubData(gl.ARRAY_BUFFER, 0, posed);
      attributes(positions, rests);
      gl.bindBuffer(gl.ELEMENT_ARRAY_BUFFER, triangles);
      gl.drawElements(gl.TRIANGLES, rig.triangles.length, gl.UNSIGNED_SHORT, 0);

      // The mouth pass runs over the posed inner lips' bounding box (scissor): the
      // interior can only lie between the two lips (+ half a pixel of edge).
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      [m.upper, m.lower].forEach((ids, side) => ids.forEach((id, i) => {
        const x = posed[3 * id], y = posed[3 * id + 1];
        lips[side][2 * i] = x;
        lips[side][2 * i + 1] = y;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }));
      const left = Math.max(0, Math.floor(x0) - 2), right = Math.min(size, Math.ceil(x1) + 3);
      const top = Math.max(0, Math.floor(y0) - 2), bottom = Math.min(size, Math.ceil(y1) + 3);
      if (right > left && bottom > top) {
        gl.useProgram(mouth.made);
        gl.uniform2fv(lipUniforms[0], lips[0]);
        gl.uniform2fv(lipUniforms[1], lips[1]);
        gl.disable(gl.DEPTH_TEST);
        gl.enable(gl.SCISSOR_TEST);
        gl.scissor(left, size - bottom, right - left, bottom - top);  // GL rows count up
        gl.enable(gl.BLEND);
        gl.blendFuncSeparate(gl.SRC_ALPHA, gl.ONE_MINUS_SRC_ALPHA, gl.ZERO, gl.ONE);
        gl.disableVertexAttribArray(1);
        gl.bindBuffer(gl.ARRAY_BUFFER, full);
        gl.vertexAttribPointer(0, 3, gl.FLOAT, false, 0, 0);
        gl.drawArrays(gl.TRIANGLE_STRIP, 0, 4);
      }
      return true;
    }

    return { draw, size, vertices: count };
  }

  return { create };
})();
