"""MediaPipe face-mesh landmarks: the detector and the index groups the rig is built from.

The reference face detector of the project: the portrait export rigs its photo with it
(export/portrait/rig.py), and the quality checks re-detect the rendered frames with it
(evals/portrait_quality.py, evals/portrait_expressions.py).

The 478-point mesh (468 + 10 iris points with `refine_landmarks`) of MediaPipe's
`face_landmark_with_attention.tflite`, run through its face-mesh graph (mediapipe==0.10.21,
Apache-2.0). Indices follow MediaPipe's canonical face model; "right"/"left" below are the
subject's, as in ARKit (the subject's left eye is on the image's right in a frontal photo).
"""

from __future__ import annotations

import numpy as np

LANDMARKS = 478

# Inner lip contour, corner to corner, as 11 upper/lower pairs of the same column.
INNER_UPPER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308)
INNER_LOWER = (78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308)
OUTER_UPPER = (61, 185, 40, 39, 37, 0, 267, 269, 270, 409, 291)
OUTER_LOWER = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291)
MOUTH_CORNERS = (61, 78, 291, 308)

# Eyelid margins, outer corner to inner corner (the corners belong to both lids).
RIGHT_EYE_UPPER = (33, 246, 161, 160, 159, 158, 157, 173, 133)
RIGHT_EYE_LOWER = (33, 7, 163, 144, 145, 153, 154, 155, 133)
LEFT_EYE_UPPER = (263, 466, 388, 387, 386, 385, 384, 398, 362)
LEFT_EYE_LOWER = (263, 249, 390, 373, 374, 380, 381, 382, 362)
RIGHT_IRIS = (468, 469, 470, 471, 472)
LEFT_IRIS = (473, 474, 475, 476, 477)

RIGHT_BROW = (70, 63, 105, 66, 107, 46, 53, 52, 65, 55)
LEFT_BROW = (300, 293, 334, 296, 336, 276, 283, 282, 295, 285)
RIGHT_BROW_INNER, LEFT_BROW_INNER = (107, 55), (336, 285)
RIGHT_BROW_OUTER, LEFT_BROW_OUTER = (70, 46), (300, 276)

FACE_OVAL = (
    10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400, 377,
    152, 148, 176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109,
)  # fmt: skip
CHIN = 152
NOSE_TIP = 1
RIGHT_CHEEK, LEFT_CHEEK = 205, 425
RIGHT_UNDER_EYE, LEFT_UNDER_EYE = 118, 347
RIGHT_NOSE_WING, LEFT_NOSE_WING = 129, 358


class NoFaceError(ValueError):
    """The landmark model found no face in an image."""


class FaceMesh:
    """MediaPipe's face mesh on still images: RGB uint8 [H, W, 3] -> landmarks [478, 3] px.

    x and y are pixels; z is MediaPipe's relative depth scaled like x (smaller is nearer).
    """

    def __init__(self, min_confidence: float = 0.5):
        from mediapipe.python.solutions import face_mesh

        self._mesh = face_mesh.FaceMesh(
            static_image_mode=True,
            max_num_faces=1,
            refine_landmarks=True,
            min_detection_confidence=min_confidence,
        )

    def __call__(self, image: np.ndarray) -> np.ndarray:
        found = self.find(image)
        if found is None:
            raise NoFaceError(f"no face found in the {image.shape[1]}x{image.shape[0]} image")
        return found

    def find(self, image: np.ndarray) -> np.ndarray | None:
        """Landmarks [478, 3] in pixels, or None when no face is found."""
        image = np.ascontiguousarray(image[..., :3], dtype=np.uint8)
        result = self._mesh.process(image)
        if not result.multi_face_landmarks:
            return None
        height, width = image.shape[:2]
        points = result.multi_face_landmarks[0].landmark
        return np.array([(p.x * width, p.y * height, p.z * width) for p in points], np.float32)

    def close(self) -> None:
        self._mesh.close()

    def __enter__(self) -> FaceMesh:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def inner_lip_gap(landmarks: np.ndarray) -> np.ndarray:
    """Mean distance in pixels between the inner upper and lower lip, over the 9 inner
    columns: [..., 478, 3] -> [...]. About 0 when the lips touch."""
    upper = landmarks[..., INNER_UPPER[1:-1], :2]
    lower = landmarks[..., INNER_LOWER[1:-1], :2]
    return np.linalg.norm(lower - upper, axis=-1).mean(axis=-1)


def eye_distance(landmarks: np.ndarray) -> float:
    """Distance in pixels between the eye centres: the rig's unit of length."""
    right = landmarks[list(RIGHT_EYE_UPPER + RIGHT_EYE_LOWER), :2].mean(axis=0)
    left = landmarks[list(LEFT_EYE_UPPER + LEFT_EYE_LOWER), :2].mean(axis=0)
    return float(np.linalg.norm(left - right))
