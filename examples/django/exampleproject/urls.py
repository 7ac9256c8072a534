"""The example's URLs: the admin (runs, read-only) with its static files, and the notes app."""

from django.conf import settings
from django.contrib import admin
from django.contrib.staticfiles.views import serve
from django.urls import path, re_path
from notes import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("conversations/<str:conversation_id>/messages", views.post_message),
    # The admin's CSS, served by Django itself so /admin/ is styled with DEBUG off too: fine
    # for an example on your machine. In production, run `manage.py collectstatic` and let
    # the web server (or WhiteNoise) serve STATIC_ROOT at STATIC_URL instead.
    re_path(rf"^{settings.STATIC_URL.lstrip('/')}(?P<path>.*)$", serve, {"insecure": True}),
]
